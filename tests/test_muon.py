"""optim.name=muon: each layer's matrix of the stacked block kernels gets optax's Muon of that
matrix alone, every other parameter gets the AdamW update of optim.name=adamw, prores.scale_updates
scales the pair, and the config and resume refuse what Muon cannot do. The sharded step equals one
device in tests/programs/sharded_train.py (section muon)."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from andrea_jax import config as config_lib, workdir
from andrea_jax.config import Config, ConfigError, ModelConfig, OptimConfig, TrainConfig
from andrea_jax.model import transformer
from andrea_jax.train import muon, optim, steps
from test_sharding import run_main

STEPS = 3
MUON_LR = 0.05
# Not 0.95, the config's and optax's default: a momentum that never reaches optax shows from step 2.
MOMENTUM = 0.9


def config(family: str, **optim_fields) -> Config:
    # no clipping (a global norm couples the groups) and a constant LR: the references see the
    # raw gradients at the peak LR
    fields = dict(name="muon", lr=1e-2, muon_lr=MUON_LR, warmup_steps=0, min_lr_ratio=1.0,
                  weight_decay=0.1, muon_weight_decay=0.1, clip_norm=1e6) | optim_fields
    return config_lib.validate(Config(
        model=ModelConfig(vocab_size=300, seq_len=16, d_model=32, n_layer=3, n_head=4, family=family),
        optim=OptimConfig(**fields), train=TrainConfig(steps=10, batch_size=4)))


def trajectory(cfg: Config, block_scales=None):
    """(params, grads, updates) of STEPS updates of `cfg`'s optimizer on random gradients."""
    params = transformer.init(cfg.model, jax.random.key(0))["params"]
    tx = optim.make(cfg.optim, cfg.train.steps, cfg.model.family, block_scales, n_layer=cfg.model.n_layer)
    update = jax.jit(tx.update) if block_scales is None else jax.jit(lambda g, s, p, t: tx.update(g, s, p, step=t))
    state, out = tx.init(params), []
    for k in range(STEPS):
        grads = jax.tree.map(lambda p, k=k: 0.01 * jax.random.normal(jax.random.key(10 + k), p.shape), params)
        updates, state = update(grads, state, params) if block_scales is None else update(grads, state, params, k)
        out.append((params, grads, jax.device_get(updates)))
        params = optax.apply_updates(params, updates)
    return out


@functools.lru_cache(maxsize=None)
def unscaled_trajectory(cfg: Config):
    """trajectory(cfg) without block scales, computed once for the tests that read the same one."""
    return trajectory(cfg)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_each_layer_s_matrix_gets_optax_muon_of_that_matrix_alone(family):
    cfg = config(family, muon_momentum=MOMENTUM)
    steps_ = trajectory(cfg)
    kernels = [n for n in steps_[0][0]["blocks"] if n.endswith("kernel")]
    assert len(kernels) == {"gpt2": 4, "llama": 5}[family]
    ref_tx = optax.contrib.muon(MUON_LR, beta=MOMENTUM, weight_decay=0.1)
    # jitted, one program per matrix shape: op by op, each of its operations would compile for every shape
    ref_init, ref_update = jax.jit(ref_tx.init), jax.jit(ref_tx.update)
    worst = 0.0
    for name in kernels:
        for layer in range(cfg.model.n_layer):
            ref_params = np.asarray(steps_[0][0]["blocks"][name])[layer]
            ref_state = ref_init(ref_params)
            for _, grads, updates in steps_:
                want, ref_state = ref_update(np.asarray(grads["blocks"][name])[layer], ref_state, ref_params)
                got, want = updates["blocks"][name][layer], np.asarray(want)
                # Newton-Schulz's five matrix polynomials, vmapped over the layers or not, round
                # differently: measured 4.1e-6 of the largest element, the same under AVX2
                err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
                assert err < 2e-5, f"{name} layer {layer}: {err}"
                worst = max(worst, err)
                ref_params = ref_params + want  # optax.apply_updates: one float32 add
    print(f"{family}: worst relative difference {worst:.2g}")


def test_the_update_is_orthogonal_per_layer_not_over_the_stack():
    """Each layer's update has Muon's shape: its singular values near one value (Newton-Schulz's
    band around 1, times the LR and width factor), whatever the gradient's scale in that layer."""
    cfg = config("gpt2", muon_weight_decay=0.0)
    params = transformer.init(cfg.model, jax.random.key(0))["params"]
    tx = optim.make(cfg.optim, cfg.train.steps, "gpt2", n_layer=3)
    scales_L = jnp.array([1e-4, 1.0, 1e3])   # a stacked orthogonalization would leave layers 0-1 near 0
    grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(3), p.shape), params)
    grads["blocks"] = jax.tree.map(lambda g: g * scales_L.reshape(-1, *(1,) * (g.ndim - 1)), grads["blocks"])
    updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)  # op by op, each operation would compile alone
    for name in ("attn_qkv_kernel", "attn_out_kernel", "mlp_fc_kernel", "mlp_proj_kernel"):
        u = updates["blocks"][name]
        width = np.sqrt(max(1.0, u.shape[2] / u.shape[1]))
        for layer in range(3):
            singular = np.linalg.svd(np.asarray(u[layer]), compute_uv=False) / (MUON_LR * width)
            assert 0.4 < singular.min() and singular.max() < 1.3, (name, layer, singular.min(), singular.max())


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_every_other_parameter_gets_the_adamw_update(family):
    muon_steps = unscaled_trajectory(config(family))
    adamw_steps = trajectory(config(family, name="adamw"))
    labels = muon.labels(muon_steps[0][0])
    others = 0
    for (_, _, got), (_, _, want) in zip(muon_steps, adamw_steps):
        for (path, label), g, w in zip(jax.tree_util.tree_leaves_with_path(labels), jax.tree.leaves(got),
                                       jax.tree.leaves(want)):
            if label == "adamw":
                # the same optax.adamw on the same leaves, compiled in another program: measured
                # equal (0 difference, native and AVX2); rtol 1e-6 leaves room for another fusion
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-9, err_msg=jax.tree_util.keystr(path))
                others += 1
            else:  # Muon's update differs from AdamW's by 140% of it or more (measured)
                assert not np.allclose(g, w, rtol=1e-2), f"{jax.tree_util.keystr(path)} is AdamW's"
    assert others == STEPS * {"gpt2": 12, "llama": 5}[family]


def test_prores_update_scales_multiply_the_muon_update_of_each_block():
    factors_L = jnp.array([0.0, 0.5, 1.0])
    plain = unscaled_trajectory(config("gpt2"))
    scaled = trajectory(config("gpt2"), block_scales=lambda step: factors_L)
    for (_, _, want), (_, _, got) in zip(plain[:1], scaled[:1]):  # after step 1 the params differ
        for name, u in got["blocks"].items():  # measured equal (native and AVX2); rtol as above
            expected = np.asarray(want["blocks"][name]) * factors_L.reshape(-1, *(1,) * (u.ndim - 1))
            np.testing.assert_allclose(u, expected, rtol=1e-6, atol=1e-12, err_msg=name)
        for name in ("tok_embedding", "lnf_scale"):
            np.testing.assert_array_equal(got[name], want[name])


def test_a_muon_train_step_learns_one_batch():
    cfg = dataclasses.replace(config("gpt2", clip_norm=1.0), train=TrainConfig(steps=30, batch_size=4))
    mesh = steps.make_mesh(cfg)
    state = steps.create_state(cfg, jax.random.key(0), mesh)
    step = steps.make_train_step(cfg, mesh)
    batch = jax.random.randint(jax.random.key(1), (4, 17), 0, 300)
    losses = []
    for _ in range(30):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0], losses


def test_a_muon_step_on_8_devices_equals_one_device():
    out = run_main("muon")
    assert "OK muon mesh (1, 8, 1) == one device" in out and "OK muon mesh (2, 2, 2) == one device" in out


def test_muon_settings_are_checked_and_refused_in_one_line():
    with pytest.raises(ConfigError, match="^optim.name: unknown optimizer 'sgd'; known: adamw, muon$"):
        config("gpt2", name="sgd")
    with pytest.raises(ConfigError, match="^optim.muon_lr: must be positive, got 0"):
        config("gpt2", muon_lr=0.0)
    with pytest.raises(ConfigError, match="^optim.muon_momentum: must be in"):
        config("gpt2", muon_momentum=1.0)
    cfg = config("gpt2")
    with pytest.raises(ConfigError, match="^optim.name: muon has no rules for model.depth_param=completep"):
        config_lib.validate(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, depth_param="completep")))


def test_a_resume_with_another_optimizer_is_refused_even_when_allowed_to_change_the_schedule():
    saved = Config().to_dict()
    now = config_lib.override(Config(), ["optim.name=muon"]).to_dict()
    identity, schedule = workdir.changed_settings(saved, now)
    assert identity == ["optim.name (saved 'adamw', now 'muon')"] and schedule == []
    _, schedule = workdir.changed_settings(saved, config_lib.override(Config(), ["optim.muon_lr=0.01"]).to_dict())
    assert schedule == ["optim.muon_lr (saved 0.02, now 0.01)"]
