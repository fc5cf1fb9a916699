"""prores.scale_updates: block l's AdamW update times alpha_l (or sqrt(alpha_l)), computed from the
step of the forward pass, against the update of the paper's AdamW from the same state. (Every mesh
and microbatch count: tests/programs/sharded_train.py; resume: tests/test_resume.py; both run with it on.)"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import config as config_lib
from andrea_jax.config import Config, ModelConfig, OptimConfig, ProResConfig, TrainConfig
from andrea_jax.model import prores
from andrea_jax.train import steps

# Stagewise from 0, T = 10, L = 3: at step 15 block 1 is on, block 2 half-way, block 3 still at 0.
STEP = 15
ALPHAS = np.array([1.0, 0.5, 0.0])
BASE = Config(model=ModelConfig(vocab_size=300, seq_len=16, d_model=32, n_layer=3, n_head=4),
              prores=ProResConfig(schedule="stagewise_0", warmup=10),
              optim=OptimConfig(lr=1e-2, warmup_steps=0, weight_decay=0.1),
              train=TrainConfig(steps=40, batch_size=4))


def with_scaling(mode):
    return dataclasses.replace(BASE, prores=dataclasses.replace(BASE.prores, scale_updates=mode))


def test_the_schedule_gives_the_alphas_this_test_relies_on():
    np.testing.assert_array_equal(prores.run_alphas(BASE, STEP), ALPHAS)


@pytest.fixture(scope="module")
def one_step_from_the_same_state():
    """{mode: (params before, params after)}: STEP plain AdamW steps, then one step of each mode."""
    mesh = steps.make_mesh(BASE)
    batches = jax.random.randint(jax.random.key(1), (STEP + 1, 4, 17), 0, 300)
    state = steps.create_state(BASE, jax.random.key(0), mesh)
    plain = steps.make_train_step(BASE, mesh)
    for batch in batches[:STEP]:  # a state with real Adam moments, at step 15
        state, _ = plain(state, batch)
    assert int(state.step) == STEP
    before = jax.device_get(state.params)
    out = {}
    for mode in ("none", "alpha", "sqrt_alpha"):
        cfg = with_scaling(mode)
        # The state's tree carries its optimizer: the leaves of the warmed state in this config's tree.
        fresh = steps.create_state(cfg, jax.random.key(0), mesh)
        start = fresh.replace(step=jnp.array(state.step), params=jax.tree.map(jnp.array, state.params),
                              opt_state=jax.tree.map(jnp.array, state.opt_state))
        after, metrics = steps.make_train_step(cfg, mesh)(start, batches[STEP])
        out[mode] = (before, jax.device_get(after.params), float(metrics["loss"]))
    return out


# The key bias's gradient is zero but for rounding, which Adam scales to an update of size lr: the two
# programs' updates of it agree only where they round alike, as at -O1 (bit-equal), not -O0.
@pytest.mark.compiled_at_o1
@pytest.mark.parametrize("mode,factor", [("alpha", ALPHAS), ("sqrt_alpha", np.sqrt(ALPHAS))])
def test_each_block_s_update_is_its_factor_times_adamw_s(one_step_from_the_same_state, mode, factor):
    before, plain, plain_loss = one_step_from_the_same_state["none"]
    _, scaled, loss = one_step_from_the_same_state[mode]
    # The forward pass does not depend on the scaling; the two train steps are other programs:
    # measured bit-equal natively, AVX2, SSE4_2; ~10 float32 ulps allowed.
    np.testing.assert_allclose(loss, plain_loss, rtol=1e-6)
    for name in before["blocks"]:
        want = plain["blocks"][name] - before["blocks"][name]
        got = scaled["blocks"][name] - before["blocks"][name]
        for l in range(3):
            if l < 2 or name.endswith("kernel"):  # block 3 has no gradient: decay alone moves its matrices
                assert np.abs(want[l]).max() > 0, (name, l)
            # The float32 subtraction of two nearby parameters rounds the update: relative to the
            # parameter, 6e-8; relative to the update, up to ~1e-5 for updates 1e-3 of the parameter.
            np.testing.assert_allclose(got[l], factor[l] * want[l], rtol=1e-6,
                                       atol=2e-7 * np.abs(before["blocks"][name][l]).max(), err_msg=f"{name} {l}")
    for name in before:
        if name != "blocks":  # embeddings, final norm: AdamW's update, untouched
            # Other programs (measured bit-equal natively, AVX2, SSE4_2): rounding allowed, the
            # blocks' bound; a scaled update would be off by O(update), 4e-3 to 7e-3 here.
            np.testing.assert_allclose(scaled[name], plain[name], rtol=1e-6,
                                       atol=2e-7 * np.abs(before[name]).max(), err_msg=name)


def test_a_block_at_alpha_zero_does_not_move(one_step_from_the_same_state):
    for mode in ("alpha", "sqrt_alpha"):
        before, after, _ = one_step_from_the_same_state[mode]
        for name in before["blocks"]:
            # exact by construction: the parameter plus an update multiplied by alpha = 0
            np.testing.assert_array_equal(after["blocks"][name][2], before["blocks"][name][2], err_msg=name)
            assert not np.array_equal(after["blocks"][name][0], before["blocks"][name][0]), name


def test_the_optimizer_state_has_one_tree_whatever_the_scaling():
    trees = {mode: jax.tree.structure(steps._abstract(with_scaling(mode)).opt_state)
             for mode in ("none", "alpha", "sqrt_alpha")}
    assert trees["none"] == trees["alpha"] == trees["sqrt_alpha"]


def test_the_scaling_is_validated_and_off_by_default(tmp_path):
    assert Config().prores.scale_updates == "none"
    with pytest.raises(config_lib.ConfigError, match=r"prores.scale_updates: unknown update scaling 'beta'"):
        config_lib.validate(config_lib.override(Config(), ["prores.scale_updates=beta"]))
