"""Every ProRes schedule against the paper's formula (ProRes paper, Table 5), written out here per (l, t)."""
import dataclasses
import math

import jax
import numpy as np
import pytest

from andrea_jax import configs
from andrea_jax.model import prores


def formula(schedule, l, t, T, L):
    """alpha(l, t) for one layer, transcribed from the paper's Table 5 with plain Python floats."""
    r = min(t / (T * l), 1.0)
    def stagewise(m):
        return min(max(m + (1 - m) * (t - T * (l - 1)) / T, m), 1.0)
    return {
        "none": 1.0,
        "linear": r,
        "linear_sqrt": math.sqrt(r),
        "linear_square": r ** 2,
        "equal": min(t / (T * L), 1.0),
        "reverse": min(t / (T * (L - l + 1)), 1.0),
        "stagewise_0": min(max((t - T * (l - 1)) / T, 0.0), 1.0),
        "stagewise_L": stagewise(1 / L),
        "stagewise_sqrt_L": stagewise(1 / math.sqrt(L)),
        "stagewise_sqrt_l": stagewise(1 / math.sqrt(l)),
        "fix_L": 1 / L,
        "fix_sqrt_L": 1 / math.sqrt(L),
        "fix_sqrt_l": 1 / math.sqrt(l),
    }[schedule]


def test_every_named_schedule_is_covered():
    assert set(prores.SCHEDULES) == {
        "none", "linear", "linear_sqrt", "linear_square", "equal", "reverse", "stagewise_0",
        "stagewise_L", "stagewise_sqrt_L", "stagewise_sqrt_l", "fix_L", "fix_sqrt_L", "fix_sqrt_l"}


@pytest.mark.parametrize("schedule", prores.SCHEDULES)
@pytest.mark.parametrize("L,T", [(12, 1000), (5, 7), (1, 3)])
def test_schedule_matches_formula(schedule, L, T):
    # Boundaries t = 0, T*l, T*L and beyond, steps just around each, and a spread in between.
    steps = {0, 1, T - 1, T, T + 1, T * L, T * L + 1, 3 * T * L, T * L // 2}
    steps |= {T * l + d for l in range(1, L + 1) for d in (-1, 0, 1)}
    steps |= {T * (l - 1) + T // 2 for l in range(1, L + 1)}
    for t in sorted(s for s in steps if s >= 0):
        got = np.asarray(prores.alphas(t, L, schedule=schedule, warmup=T))
        want = np.array([formula(schedule, l, t, T, L) for l in range(1, L + 1)], np.float32)
        assert got.shape == (L,) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=f"{schedule} t={t}")


def test_first_forward_is_identity_and_linear_ends_at_T_l():
    a = prores.alphas(0, 4, schedule="linear", warmup=10)
    assert np.all(np.asarray(a) == 0)
    # Layer l reaches exactly 1 at step T*l and not a step earlier.
    for l in range(1, 5):
        assert float(prores.alphas(10 * l, 4, warmup=10)[l - 1]) == 1.0
        assert float(prores.alphas(10 * l - 1, 4, warmup=10)[l - 1]) < 1.0


def test_traced_step_compiles_once():
    traces = []

    @jax.jit
    def f(step):
        traces.append(1)
        return prores.alphas(step, 6, schedule="stagewise_sqrt_l", warmup=5)

    for t in (0, 3, 17, 400):
        np.testing.assert_allclose(f(t), prores.alphas(t, 6, schedule="stagewise_sqrt_l", warmup=5))
    assert len(traces) == 1


def test_zero_warmup_means_fully_on_and_bad_arguments_fail():
    np.testing.assert_array_equal(prores.alphas(0, 3, schedule="linear", warmup=0), np.ones(3))
    with pytest.raises(ValueError, match="unknown ProRes schedule 'cosine'"):
        prores.alphas(0, 3, schedule="cosine")
    with pytest.raises(ValueError, match="warmup"):
        prores.alphas(0, 3, warmup=-1)
    # a config built without validation: the update scaling it names is refused by name, not by a KeyError
    cfg = configs.load("tiny")
    cfg = dataclasses.replace(cfg, prores=dataclasses.replace(cfg.prores, scale_updates="alpha_cubed"))
    with pytest.raises(ValueError, match="unknown prores.scale_updates 'alpha_cubed'; known: none, alpha"):
        prores.update_scales(cfg, 0)


def test_what_a_run_multiplies_its_branches_and_its_updates_by():
    from andrea_jax import config as config_lib
    run = lambda *extra: config_lib.validate(config_lib.override(configs.load("tiny"), [
        "model.n_layer=4", "prores.schedule=linear", "prores.warmup=10", *extra]))
    a = np.array([formula("linear", l, 15, 10, 4) for l in range(1, 5)], np.float32)
    assert a.tolist() == [1.0, 0.75, 0.5, 0.375]
    np.testing.assert_array_equal(prores.run_alphas(run(), 15), a)
    np.testing.assert_array_equal(prores.run_alphas(run("prores.forward=false", "prores.scale_updates=alpha"), 15),
                                  np.ones(4))
    # Depth-muP at 4 blocks of base depth 1: every branch times (4 / 1)^(-1/2) = 0.5, on top of the alphas
    np.testing.assert_array_equal(prores.run_alphas(run("model.depth_param=depth_mup", "model.depth_base=1"), 15),
                                  a * np.float32(0.5))
    for mode, want in {"none": np.ones(4, np.float32), "alpha": a, "sqrt_alpha": np.sqrt(a),
                       "alpha_sq": np.square(a)}.items():
        np.testing.assert_array_equal(prores.update_scales(run(f"prores.scale_updates={mode}"), 15), want)
    # the update takes the schedule's alphas whether or not the forward pass uses them
    np.testing.assert_array_equal(
        prores.update_scales(run("prores.forward=false", "prores.scale_updates=alpha"), 15), a)
