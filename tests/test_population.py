"""andrea_jax.train.population: N members trained by one vmapped step compute what their solo runs
compute (steps.create_state + steps.make_train_step, same batches), a member gone non-finite is
frozen without touching its neighbours, members that differ in a structural setting are refused, and
8 members on 8 devices equal one device."""
import dataclasses
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax.config import SCHEDULES, Config, ModelConfig, OptimConfig, ProResConfig, TrainConfig
from andrea_jax.errors import ConfigError
from andrea_jax.model import prores
from andrea_jax.train import optim, population, steps
from _devices import cpu_devices_env
from _helpers import PROGRAMS

K = 24  # steps: past every ProRes ramp and every LR warmup but member 3's, longer than the run (capped at K)
BASE = Config(model=ModelConfig(vocab_size=300, seq_len=16, d_model=32, n_layer=2, n_head=4),
              prores=ProResConfig(schedule="linear", warmup=5),
              optim=OptimConfig(lr=1e-2, warmup_steps=5, weight_decay=0.1),
              train=TrainConfig(steps=K, batch_size=4, data_seed=0))
MEMBERS = [
    ["train.seed=0", "optim.lr=1e-2", "optim.warmup_steps=0", "optim.weight_decay=0.1", "prores.warmup=5"],
    ["train.seed=1", "optim.lr=3e-3", "optim.warmup_steps=5", "optim.weight_decay=0.0", "prores.warmup=8",
     "prores.scale_updates=alpha"],
    ["train.seed=2", "optim.lr=5e-3", "optim.warmup_steps=3", "optim.weight_decay=1.5", "prores.warmup=3",
     "prores.scale_updates=alpha", "prores.forward=false"],
    ["train.seed=0", "optim.lr=2e-2", "optim.warmup_steps=40", "optim.weight_decay=0.05", "prores.warmup=0"],
]
# Measured on the CPU after K steps: the largest |population - solo| over the parameters was 1.5e-4
# (member 0; 6e-6 to 1.2e-4 for the others), over the optimizer state 4.3e-7. It is rounding, magnified:
# a solo run of member 0 started one ulp away in the embedding ends 2e-4 away (Adam's early steps
# divide near-zero gradients by their own size), and the vmapped program rounds unlike the solo one.
TOLERANCE = 5e-4
OPT_TOLERANCE = 2e-6


@pytest.fixture(scope="module")
def mesh():
    return steps.make_mesh(BASE)


@pytest.fixture(scope="module")
def batches():
    return jax.random.randint(jax.random.key(7), (K, BASE.train.batch_size, BASE.model.seq_len + 1), 0, 300)


@pytest.fixture(scope="module")
def solo(mesh, batches):
    """solo(cfg) -> (params, opt_state) of a solo run of cfg over the K batches (cached)."""
    runs = {}

    def run(cfg):
        if cfg not in runs:
            state = steps.create_state(cfg, jax.random.key(cfg.train.seed), mesh)
            step = steps.make_train_step(cfg, mesh)
            for tokens in batches:
                state, _ = step(state, tokens)
            runs[cfg] = jax.device_get((state.params, state.opt_state))
        return runs[cfg]
    return run


@pytest.fixture(scope="module")
def pop_step(mesh):
    """One compiled population step: it depends on the members' structure, not on their settings."""
    return population.make_train_step(population.member_configs(BASE, MEMBERS), mesh)


def train(state, step, batches):
    for tokens in batches:
        state, metrics = step(state, tokens)
    return jax.device_get(state), jax.device_get(metrics)


def max_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) for x, y in
               zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def test_every_member_equals_its_solo_run(mesh, batches, solo, pop_step):
    cfgs = population.member_configs(BASE, MEMBERS)
    state, metrics = train(population.create_states(cfgs, mesh), pop_step, batches)
    assert metrics["loss"].shape == (len(cfgs),) and not metrics["frozen"].any()
    assert list(state.step) == [K] * len(cfgs)
    for i, cfg in enumerate(cfgs):
        _, params, opt_state = population.member(state, i)
        solo_params, solo_opt_state = solo(cfg)
        assert jax.tree.structure(opt_state) == jax.tree.structure(solo_opt_state)
        print(f"member {i}: max |params - solo| = {max_diff(params, solo_params):.3g}, "
              f"opt_state {max_diff(opt_state, solo_opt_state):.3g}")
        assert max_diff(params, solo_params) <= TOLERANCE, i
        assert max_diff(opt_state, solo_opt_state) <= OPT_TOLERANCE, i
    # The members moved apart: equal settings would have let a per-member bug pass.
    assert max_diff(population.member(state, 0)[1], population.member(state, 3)[1]) > 100 * TOLERANCE


def check_frozen_and_neighbours(state, metrics, cfgs, bad, initial_params, solo):
    assert list(metrics["frozen"]) == [i == bad for i in range(len(cfgs))]
    assert state.step[bad] == 0
    np.testing.assert_array_equal(  # kept as it was, NaNs included
        np.concatenate([np.ravel(x) for x in jax.tree.leaves(population.member(state, bad)[1])]),
        np.concatenate([np.ravel(x) for x in jax.tree.leaves(initial_params)]))
    for i, cfg in enumerate(cfgs):
        if i != bad:
            assert max_diff(population.member(state, i)[1], solo(cfg)[0]) <= TOLERANCE, i


def check_opt_state_kept(state, bad, initial_opt_state):
    np.testing.assert_array_equal(
        np.concatenate([np.ravel(x) for x in jax.tree.leaves(population.member(state, bad)[2])]),
        np.concatenate([np.ravel(x) for x in jax.tree.leaves(initial_opt_state)]))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 1e39: float32's inf
@pytest.mark.parametrize("setting", ["optim.lr=1e39", "optim.weight_decay=1e39"])  # every update, or the decayed
def test_a_member_with_a_non_finite_update_is_frozen_and_the_others_are_solo_runs(mesh, batches, solo, pop_step,
                                                                                   setting):
    bad = 1
    cfgs = population.member_configs(BASE, [m + [setting] if i == bad else m for i, m in enumerate(MEMBERS)])
    start = population.create_states(cfgs, mesh)
    _, initial, initial_opt_state = jax.device_get(population.member(start, bad))
    state, metrics = train(start, pop_step, batches)
    check_frozen_and_neighbours(state, metrics, cfgs, bad, initial, solo)
    check_opt_state_kept(state, bad, initial_opt_state)


def test_a_member_with_a_nan_parameter_is_frozen_and_the_others_are_solo_runs(mesh, batches, solo, pop_step):
    bad = 2
    cfgs = population.member_configs(BASE, MEMBERS)
    start = population.create_states(cfgs, mesh)
    wte = start.params["tok_embedding"]
    start = start.replace(params={**start.params, "tok_embedding": wte.at[bad, 0, 0].set(jnp.nan)})
    initial = jax.device_get(population.member(start, bad)[1])
    state, metrics = train(start, pop_step, batches)
    assert np.isnan(metrics["loss"][bad])
    check_frozen_and_neighbours(state, metrics, cfgs, bad, initial, solo)


@pytest.mark.parametrize("schedule,decay_steps", [("cosine", 0), ("wsd", 0), ("wsd", 7)])
@pytest.mark.parametrize("warmup", [0, 1, 3, K, K + 5])
def test_lr_at_is_optim_lr_schedule_at_traced_settings(schedule, decay_steps, warmup):
    cfg = dataclasses.replace(BASE, optim=dataclasses.replace(BASE.optim, schedule=schedule, warmup_steps=warmup,
                                                              lr=3e-3, decay_steps=decay_steps))
    expected = optim.lr_schedule(cfg.optim, K)
    at = jax.jit(jax.vmap(lambda t: population.lr_at(cfg, jnp.float32(3e-3), jnp.int32(warmup), t)))
    t = jnp.arange(K + 3, dtype=jnp.int32)
    np.testing.assert_allclose(at(t), jax.vmap(expected)(t), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_schedule_alphas_at_a_traced_t_are_prores_s(schedule):
    cfg = dataclasses.replace(BASE, prores=dataclasses.replace(BASE.prores, schedule=schedule))
    t = jnp.arange(0, 30, dtype=jnp.int32)
    at = jax.jit(jax.vmap(lambda T, s: population.schedule_alphas(cfg, T, s), in_axes=(None, 0)))
    for T in (0, 1, 3, 7):
        expected = jax.vmap(lambda s: prores.alphas(s, cfg.model.n_layer, schedule=schedule, warmup=T))(t)
        np.testing.assert_allclose(at(jnp.int32(T), t), expected, rtol=1e-6, atol=1e-7, err_msg=f"T={T}")


@pytest.mark.parametrize("overrides,key", [
    ([[], ["model.d_model=64"]], "model.d_model"),
    ([[], ["optim.schedule=wsd"]], "optim.schedule"),
    ([[], ["train.batch_size=8"]], "train.batch_size"),
    ([["train.data_seed=-1"], ["train.data_seed=-1", "train.seed=3"]], "train.data_seed"),
    ([["optim.name=muon"]], "optim.name"),
    ([["train.batch_ramp=2@64"]], "train.batch_ramp"),
    ([["model.seq_len_ramp=8@64"]], "model.seq_len_ramp"),
    ([["prores.warmup_tokens=320"]], "prores.warmup_tokens"),
])
def test_a_structural_difference_is_refused_by_name(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        population.member_configs(BASE, overrides)


# Measured over 6 steps of 8 mixed members (tests/programs/population_sharded.py) against one device, the
# same natively and under XLA_FLAGS=--xla_cpu_max_isa=AVX2: the largest |difference| of a parameter 2.2e-4
# (mesh data=8; 5.2e-5 with fsdp=8), of a loss 2.4e-6 (1.4e-6). The sharded program sums in another order,
# and Adam turns the rounding of a near-zero gradient into a difference of up to the LR (member 4, LR 1.5e-2,
# in an MLP weight; TOLERANCE above is the same effect against solo runs).
SHARDED_PARAMS_TOLERANCE, SHARDED_LOSS_TOLERANCE = 1e-3, 1e-5


def test_eight_members_on_eight_devices_equal_one_device():
    proc = subprocess.run([sys.executable, str(PROGRAMS / "population_sharded.py"), str(SHARDED_PARAMS_TOLERANCE),
                           str(SHARDED_LOSS_TOLERANCE)], env=cpu_devices_env(8), capture_output=True, text=True,
                          timeout=600)
    print(proc.stdout)
    assert proc.returncode == 0 and "ALL OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("8 members on 8 devices against one device") == 2


# Every optimizer option a member can carry, depth-µP's multipliers (L0 = 1, so they are not 1), the document
# mask and the z-loss, and every update scaling.
OPTIONS_BASE = dataclasses.replace(
    BASE, model=dataclasses.replace(BASE.model, depth_param="depth_mup", depth_base=1),
    optim=dataclasses.replace(BASE.optim, ema=0.9, skip_spikes=0.5, skip_spikes_window=4, z_loss=1e-3,
                              skip_nonfinite=True),
    data=dataclasses.replace(BASE.data, document_mask=True))
OPTIONS_MEMBERS = [
    ["train.seed=0", "prores.scale_updates=sqrt_alpha"],
    ["train.seed=1", "prores.scale_updates=alpha_sq", "optim.lr=3e-3"],
    ["train.seed=2", "prores.warmup=8"],
]
EOT = 5
# Measured over the K steps, natively and under XLA_FLAGS=--xla_cpu_max_isa=AVX2: the largest relative
# |population - solo| of a metric 2.6e-5 (layer_grad_norm; loss 4.5e-7, lr 3.2e-7), of a parameter 1.2e-4
# absolute, of the optimizer state 7.1e-5: it holds the parameters' moving average, which differs as they do.
# No absolute slack: a metric that is 0 (the LR at step 0) is exactly 0 on both sides.
METRIC_RTOL, METRIC_ATOL = 2e-4, 0.0


def test_members_with_every_option_equal_their_solo_runs_metric_by_metric(mesh):
    cfgs = population.member_configs(OPTIONS_BASE, OPTIONS_MEMBERS)
    tokens = jax.random.randint(jax.random.key(8), (K, BASE.train.batch_size, BASE.model.seq_len + 1), 0, 300)
    tokens = tokens.at[:, :, ::6].set(EOT)  # documents of 6 tokens: the mask matters in every row
    pop_step = population.make_train_step(cfgs, mesh, with_diagnostics=True, eot_id=EOT)
    state = population.create_states(cfgs, mesh)
    pop_metrics = []
    for batch in tokens:
        state, metrics = pop_step(state, batch)
        pop_metrics.append(jax.device_get(metrics))
    assert not any(m["frozen"].any() for m in pop_metrics) and list(state.step) == [K] * len(cfgs)
    assert pop_metrics[-1]["skipped_spikes"].max() > 0  # the spike test acted
    for i, cfg in enumerate(cfgs):
        solo_state = steps.create_state(cfg, jax.random.key(cfg.train.seed), mesh)
        solo_step = steps.make_train_step(cfg, mesh, with_diagnostics=True, eot_id=EOT)
        for k, batch in enumerate(tokens):
            solo_state, solo_metrics = solo_step(solo_state, batch)
            for key, value in jax.device_get(solo_metrics).items():
                if key in pop_metrics[k]:
                    np.testing.assert_allclose(pop_metrics[k][key][i], value, rtol=METRIC_RTOL, atol=METRIC_ATOL,
                                               err_msg=f"member {i}, step {k}, {key}")
        _, params, opt_state = population.member(state, i)
        assert jax.tree.structure(opt_state) == jax.tree.structure(solo_state.opt_state)
        print(f"member {i}: max |params - solo| = {max_diff(params, solo_state.params):.3g}, "
              f"opt_state {max_diff(opt_state, solo_state.opt_state):.3g}")
        assert max_diff(params, solo_state.params) <= TOLERANCE, i
        assert max_diff(opt_state, solo_state.opt_state) <= TOLERANCE, i
    assert set(pop_metrics[0]) >= {"z_loss", "skipped_spikes", "update_ratio", "layer_grad_norm"}
