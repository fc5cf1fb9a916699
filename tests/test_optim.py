"""The optimizer: LR schedules at their endpoints against their formulas, weight decay on matrices
only, global-norm clipping, and the finiteness guard of optim.skip_nonfinite."""
import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from andrea_jax import model as model_lib
from andrea_jax.train import optim
from andrea_jax.config import ModelConfig, OptimConfig

LR, TOTAL, WARMUP = 1e-3, 1000, 100


def cosine_formula(t, *, lr=LR, total=TOTAL, warmup=WARMUP, min_ratio=0.1):
    if t < warmup:
        return lr * t / warmup
    end = lr * min_ratio
    return end + (lr - end) * 0.5 * (1 + math.cos(math.pi * (t - warmup) / (total - warmup)))


def wsd_formula(t, *, lr=LR, total=TOTAL, warmup=WARMUP, decay_fraction=0.2):
    decay_start = total - round(total * decay_fraction)
    if t < warmup:
        return lr * t / warmup
    if t < decay_start:
        return lr
    return lr * (total - t) / (total - decay_start)


# optax evaluates the schedules in float32, the formulas here in float64. Measured: wsd 4.8e-8
# relative; cosine 4.0e-6 at t = 1 (its float32 warmup ramp rounds a 1e-5 learning rate), 2.1e-7 elsewhere.
@pytest.mark.parametrize("t", [0, 1, WARMUP // 2, WARMUP, 550, TOTAL - 1, TOTAL])
def test_cosine_schedule_matches_its_formula(t):
    cfg = OptimConfig(lr=LR, schedule="cosine", warmup_steps=WARMUP, min_lr_ratio=0.1)
    assert float(optim.lr_schedule(cfg, TOTAL)(t)) == pytest.approx(cosine_formula(t), rel=1e-5, abs=1e-12)


@pytest.mark.parametrize("t", [0, WARMUP // 2, WARMUP, 500, 800, 900, TOTAL])
def test_wsd_schedule_matches_its_formula(t):
    cfg = OptimConfig(lr=LR, schedule="wsd", warmup_steps=WARMUP, decay_fraction=0.2)
    assert float(optim.lr_schedule(cfg, TOTAL)(t)) == pytest.approx(wsd_formula(t), rel=1e-6, abs=1e-12)


def test_schedule_endpoints():
    cosine = optim.lr_schedule(OptimConfig(lr=LR, warmup_steps=WARMUP, min_lr_ratio=0.1), TOTAL)
    wsd = optim.lr_schedule(OptimConfig(lr=LR, schedule="wsd", warmup_steps=WARMUP, decay_fraction=0.2), TOTAL)
    assert float(cosine(0)) == float(wsd(0)) == 0.0                     # from zero
    assert float(cosine(WARMUP)) == pytest.approx(LR) == float(wsd(WARMUP))  # peak after warmup
    assert float(cosine(TOTAL)) == pytest.approx(0.1 * LR)               # cosine ends at min_lr_ratio
    assert float(wsd(800)) == pytest.approx(LR) and float(wsd(TOTAL)) == pytest.approx(0.0, abs=1e-12)


def test_phases_longer_than_the_run_are_cut_to_it_and_a_decay_fraction_rounds_to_whole_steps():
    # optax's float32 schedules against Python floats: measured 4.7e-8 relative at most (float32's rounding
    # of 1e-3), natively and with XLA_FLAGS=--xla_cpu_max_isa=AVX2
    for schedule in ("cosine", "wsd"):  # a warmup longer than the run spans the run
        assert float(optim.lr_schedule(OptimConfig(lr=LR, schedule=schedule, warmup_steps=30), 10)(5)) == \
            pytest.approx(LR / 2, rel=1e-6)
    # a decay longer than the run decays over all of it, to 0 at its end
    wsd = optim.lr_schedule(OptimConfig(lr=LR, schedule="wsd", warmup_steps=0, decay_steps=20), 10)
    assert [float(wsd(t)) for t in (0, 5, 10)] == pytest.approx([LR, LR / 2, 0.0], rel=1e-6, abs=1e-12)
    # 10% of 27 steps is 2.7: the decay takes 3
    wsd = optim.lr_schedule(OptimConfig(lr=LR, schedule="wsd", warmup_steps=5, decay_fraction=0.1), 27)
    assert [float(wsd(t)) for t in range(23, 28)] == pytest.approx([LR, LR, LR * 2 / 3, LR / 3, 0.0], rel=1e-6,
                                                                    abs=1e-12)


@functools.cache
def learned_gate_params():
    cfg = ModelConfig(vocab_size=300, seq_len=16, d_model=32, n_layer=2, n_head=4, gates="learned")
    return model_lib.init(cfg, jax.random.key(0))["params"]


def test_weight_decay_reaches_matrices_only():
    params = learned_gate_params()
    names = {jax.tree_util.keystr(path): decay for path, decay in
             jax.tree_util.tree_leaves_with_path(optim.decay_mask(params))}
    assert "['blocks']['residual_gate']" in names
    for name, decay in names.items():
        assert decay == name.endswith(("kernel']", "embedding']")), name
    # With a zero gradient, AdamW's update is the decay alone: -lr * weight_decay * param, masked.
    cfg = OptimConfig(lr=0.5, warmup_steps=0, weight_decay=0.1)
    tx = optim.make(cfg, 10)
    params = jax.tree.map(lambda p: p + 1.0, params)  # gates start at 0: make every decay visible
    updates, _ = jax.jit(tx.update)(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    for (path, u), p in zip(jax.tree_util.tree_leaves_with_path(updates), jax.tree.leaves(params)):
        expected = -0.5 * 0.1 * p if names[jax.tree_util.keystr(path)] else jnp.zeros_like(p)
        np.testing.assert_allclose(u, expected, rtol=1e-6, err_msg=jax.tree_util.keystr(path))


def first_moment(opt_state):
    adam = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, optax.ScaleByAdamState))
            if isinstance(s, optax.ScaleByAdamState)]
    return adam[0].mu


@pytest.mark.parametrize("grad_norm", [10.0, 0.5])
def test_gradients_are_clipped_to_the_global_norm(grad_norm):
    cfg = OptimConfig(lr=1e-3, warmup_steps=0, clip_norm=1.0, b1=0.9)
    params = {"a": jnp.ones((3, 4)), "b": jnp.ones((5,))}
    grads = jax.tree.map(lambda p: p * grad_norm / math.sqrt(17), params)  # 17 entries: norm grad_norm
    tx = optim.make(cfg, 10)
    _, state = tx.update(grads, tx.init(params), params)
    clipped = jax.tree.map(lambda m: m / (1 - cfg.b1), first_moment(state))  # Adam's mu = (1 - b1) g
    # float32 arithmetic against float64 formulas: measured 6.0e-8 relative here and in the schedules
    assert float(optax.tree.norm(clipped)) == pytest.approx(min(grad_norm, cfg.clip_norm), rel=1e-6)
    for c, g in zip(jax.tree.leaves(clipped), jax.tree.leaves(grads)):  # scaled, never turned
        np.testing.assert_allclose(c, g * min(1.0, cfg.clip_norm / grad_norm), rtol=1e-6)


@pytest.mark.parametrize("skip", [True, False])
def test_non_finite_gradient_is_skipped_and_counted_only_when_asked(skip):
    cfg = OptimConfig(lr=1e-2, warmup_steps=0, skip_nonfinite=skip)
    params = {"w": jnp.ones((4, 4))}
    tx = optim.make(cfg, 10)
    state = tx.init(params)
    good = {"w": jnp.full((4, 4), 0.5)}
    bad = {"w": good["w"].at[0, 0].set(jnp.nan)}
    updates, state = tx.update(good, state, params)
    params = optax.apply_updates(params, updates)
    before = params
    updates, state = tx.update(bad, state, params)
    params = optax.apply_updates(params, updates)
    counts = jax.device_get(optim.skip_counts(state))
    assert (int(counts["skipped_updates"]), int(counts["skipped_in_a_row"])) == (1, 1)
    if skip:
        np.testing.assert_array_equal(params["w"], before["w"])  # the update was not applied
        updates, state = tx.update(good, state, params)
        assert int(optim.skip_counts(state)["skipped_in_a_row"]) == 0  # a finite one resets the run
        assert np.all(np.isfinite(np.asarray(optax.apply_updates(params, updates)["w"])))
    else:
        assert not np.all(np.isfinite(np.asarray(params["w"])))  # applied as plain AdamW would


def test_guard_off_computes_plain_adamw():
    cfg = OptimConfig(lr=1e-2, warmup_steps=3)
    plain = optax.chain(optax.clip_by_global_norm(cfg.clip_norm),
                        optax.adamw(optim.lr_schedule(cfg, 10), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                                    weight_decay=cfg.weight_decay, mask=optim.decay_mask))
    guarded = optim.make(dataclasses.replace(cfg, skip_nonfinite=False), 10)
    params = {"mlp_kernel": jnp.ones((8, 4)), "mlp_bias": jnp.zeros((4,)), "tok_embedding": jnp.ones((5, 8))}
    p1, s1, p2, s2 = params, plain.init(params), params, guarded.init(params)
    plain_update, guarded_update = jax.jit(plain.update), jax.jit(guarded.update)
    for k in range(3):
        grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(k), p.shape), params)
        u1, s1 = plain_update(grads, s1, p1)
        u2, s2 = guarded_update(grads, s2, p2)
        p1, p2 = optax.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):  # jitted, as in the train step
        # The guard wraps the same math in another program: measured bit-equal natively, AVX2,
        # SSE4_2; ~10 float32 ulps of the parameters (near 1) or of the updates (1e-2) allowed.
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)


def test_a_schedule_it_does_not_know_is_refused_by_name():
    with pytest.raises(ValueError, match="^unknown LR schedule 'linear'$"):
        optim.lr_schedule(dataclasses.replace(OptimConfig(), schedule="linear"), 100)
