"""The controls and variants of ProRes: prores.forward=false (the per-block LR ramp alone),
prores.scale_updates=alpha_sq, model.zero_init_out and model.depth_param (Depth-muP, CompleteP),
each against a hand computation: the schedule none's forward, a hand-built optax.adamw step, the
embedding-only model in jnp, and the papers' (L / L0)^-a rules."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from _helpers import forward_logits
from andrea_jax import config as config_lib, model as model_lib, workdir
from andrea_jax.config import Config, ModelConfig, OptimConfig, ProResConfig, TrainConfig
from andrea_jax.model import depth, prores
from andrea_jax.train import optim, steps

# Stagewise from 0, T = 10, L = 3: at step 15 block 1 is on, block 2 half-way, block 3 still at 0.
STEP = 15
ALPHAS = np.array([1.0, 0.5, 0.0], np.float32)
BASE = Config(model=ModelConfig(vocab_size=300, seq_len=16, d_model=32, n_layer=3, n_head=4),
              prores=ProResConfig(schedule="stagewise_0", warmup=10),
              optim=OptimConfig(lr=1e-2, warmup_steps=0, weight_decay=0.1),
              train=TrainConfig(steps=40, batch_size=4))
BATCH = jax.random.randint(jax.random.key(1), (4, 17), 0, 300)
# Jitted, as the train step is: run op by op, each of their operations would compile on its own.
loss_fn = jax.jit(steps.loss_fn, static_argnums=1)
loss_grad = jax.jit(jax.grad(steps.loss_fn), static_argnums=1)


def edit(cfg, **sections):
    """cfg with some fields of some sections replaced: edit(cfg, prores={"forward": False})."""
    return config_lib.validate(dataclasses.replace(
        cfg, **{name: dataclasses.replace(getattr(cfg, name), **fields) for name, fields in sections.items()}))


@functools.lru_cache(maxsize=None)
def one_step(cfg):
    """(params before, params after, loss, model) of one train step from a fresh init at STEP."""
    mesh = steps.make_mesh(cfg)
    state = steps.create_state(cfg, jax.random.key(0), mesh)
    state = state.replace(step=jnp.array(STEP, jnp.int32))
    before = jax.device_get(state.params)
    after, metrics = steps.make_train_step(cfg, mesh)(state, BATCH)
    model = model_lib.Andrea(cfg.model, cfg.kernels.impl, padded_logits=True)
    return before, jax.device_get(after.params), float(metrics["loss"]), model


def hand_adamw_update(cfg, params, grads, eps=None):
    """The paper's AdamW step from a fresh state, built here from optax's parts (count 0: peak LR)."""
    tx = optax.chain(optax.clip_by_global_norm(cfg.optim.clip_norm),
                     optax.adamw(cfg.optim.lr, b1=cfg.optim.b1, b2=cfg.optim.b2,
                                 eps=cfg.optim.eps if eps is None else eps,
                                 weight_decay=cfg.optim.weight_decay, mask=optim.decay_mask(params)))
    return jax.tree.map(np.array, jax.jit(lambda g, p: tx.update(g, tx.init(p), p)[0])(grads, params))


def assert_updates(before, after, want_updates, factors_L, rest_factor=1.0):
    """after - before == factor x want, block by block (the blocks' rows by factors_L); float32
    subtraction of nearby parameters rounds the update to ~6e-8 of the parameter."""
    for name, p in before.items():
        if name == "blocks":
            for leaf, p_L in p.items():
                got, want = after["blocks"][leaf] - p_L, want_updates["blocks"][leaf]
                for l, factor in enumerate(factors_L):
                    np.testing.assert_allclose(got[l], factor * want[l], rtol=1e-5,
                                               atol=2e-7 * np.abs(p_L[l]).max() + 1e-12, err_msg=f"{leaf} {l}")
        else:
            np.testing.assert_allclose(after[name] - p, rest_factor * want_updates[name], rtol=1e-5,
                                       atol=2e-7 * np.abs(p).max(), err_msg=name)


def test_the_schedule_gives_the_alphas_this_test_relies_on():
    np.testing.assert_array_equal(prores.schedule_alphas(BASE, STEP), ALPHAS)


# prores.forward=false


def test_forward_false_computes_what_schedule_none_computes_bit_for_bit():
    control = edit(BASE, prores={"forward": False, "scale_updates": "alpha"})
    plain = edit(BASE, prores={"schedule": "none"})
    params = model_lib.init(BASE.model, jax.random.key(0))
    model = model_lib.Andrea(BASE.model)
    logits = {name: np.asarray(forward_logits(model, params["params"], BATCH[:, :-1], prores.run_alphas(cfg, STEP)))
              for name, cfg in (("control", control), ("none", plain))}
    np.testing.assert_array_equal(logits["control"], logits["none"])
    # ... and the train step's forward too: two programs that differ only after the loss.
    assert one_step(control)[2] == one_step(plain)[2]


def test_forward_false_moves_each_block_by_alpha_times_adamw():
    control = edit(BASE, prores={"forward": False, "scale_updates": "alpha"})
    before, after, _, model = one_step(control)
    _, plain, _, _ = one_step(edit(BASE, prores={"schedule": "none"}))  # the same forward, so the same grads
    assert_updates(before, after, jax.tree.map(np.subtract, plain, before), ALPHAS)
    # That unscaled step is optax.adamw's on the gradient of the all-ones forward. Two programs'
    # gradients differ by ulps, which Adam's first step g / (|g| + eps) magnifies where g is near 0:
    # measured at most 5.9e-6 x lr (natively and under AVX2; up to 2.5e-4 x lr against a gradient
    # computed op by op); a wrong scale is off by ~lr.
    grads = loss_grad(before, model, BATCH, jnp.ones((3,), jnp.float32))
    want = hand_adamw_update(control, before, grads)
    # The key bias's exact gradient is 0 (softmax ignores a shift of every key's logit by q . b_k):
    # its computed gradient is rounding noise, which Adam's first step blows up to O(lr); left out.
    D = BASE.model.d_model
    want["blocks"]["attn_qkv_bias"][:, D:2 * D] = plain["blocks"]["attn_qkv_bias"][:, D:2 * D] - \
        before["blocks"]["attn_qkv_bias"][:, D:2 * D]
    jax.tree.map(lambda p, q, w: np.testing.assert_allclose(q - p, w, rtol=0, atol=1e-3 * control.optim.lr),
                 before, plain, want)
    np.testing.assert_array_equal(after["blocks"]["mlp_fc_kernel"][2], before["blocks"]["mlp_fc_kernel"][2])


# prores.scale_updates=alpha_sq


def test_alpha_sq_moves_each_block_by_alpha_squared_times_the_unscaled_update():
    before, unscaled, _, _ = one_step(BASE)
    _, squared, _, _ = one_step(edit(BASE, prores={"scale_updates": "alpha_sq"}))
    want = jax.tree.map(np.subtract, unscaled, before)
    assert np.abs(want["blocks"]["attn_out_kernel"][1]).max() > 0  # block 2 has a gradient to scale
    assert_updates(before, squared, want, ALPHAS ** 2)


# model.zero_init_out


def _embedding_only_logits(cfg: ModelConfig, params, tokens_BT):
    """The model without blocks, in jnp: the embeddings through the final norm and the head."""
    T = tokens_BT.shape[1]
    if cfg.family == "gpt2":
        x = params["tok_embedding"][tokens_BT] + params["pos_embedding"][:T]
        mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        y = (x - mean) / jnp.sqrt(var + cfg.ln_eps) * params["lnf_scale"] + params["lnf_bias"]
        return y @ params["tok_embedding"].T
    x = params["tok_embedding"][tokens_BT]
    y = x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + cfg.ln_eps) * params["lnf_scale"]
    return y @ params["lm_head_kernel"]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_zero_init_out_starts_every_block_as_the_identity(family):
    cfg = dataclasses.replace(BASE.model, family=family, zero_init_out=True)
    params = model_lib.init(cfg, jax.random.key(0))["params"]
    for name in model_lib.OUTPUT_PROJECTIONS:
        np.testing.assert_array_equal(params["blocks"][name], 0.0)
    assert np.abs(params["blocks"]["attn_qkv_kernel"]).min() > 0  # the rest keeps model.init's draw
    logits = forward_logits(model_lib.Andrea(cfg), params, BATCH[:, :-1], jnp.ones((3,), jnp.float32))
    # Two programs (the model's norms against jnp's): measured max |diff| 1.8e-7 (gpt2), 1.2e-7 (llama)
    # natively and under AVX2, logits up to 0.65; the blocks at their usual init move them by 0.06-0.3.
    np.testing.assert_allclose(logits, _embedding_only_logits(cfg, params, BATCH[:, :-1]), rtol=0, atol=1e-6)


# model.depth_param (L0 = 4; L = 4 and 8)


@pytest.mark.parametrize("param,a", [("depth_mup", 0.5), ("completep", 1.0)])
@pytest.mark.parametrize("n_layer", [4, 8])
def test_depth_multipliers_are_the_papers(param, a, n_layer):
    cfg = dataclasses.replace(BASE.model, n_layer=n_layer, depth_param=param, depth_base=4)
    m = n_layer / 4
    # hand values: m = 2 gives 2^-1/2 and 1/2 for the branch and eps, 2^-1/2 and 1 for the hidden LR
    assert depth.branch_multiplier(cfg) == pytest.approx(m ** -a, rel=1e-15)
    assert depth.eps_scale(cfg) == pytest.approx(m ** -a, rel=1e-15)
    assert depth.hidden_lr_scale(cfg) == pytest.approx(m ** (a - 1), rel=1e-15)
    if n_layer == 8:
        assert depth.hidden_lr_scale(cfg) == pytest.approx({"depth_mup": 0.5 ** 0.5, "completep": 1.0}[param])
    sp = dataclasses.replace(cfg, depth_param="sp")
    assert (depth.branch_multiplier(sp), depth.hidden_lr_scale(sp), depth.eps_scale(sp)) == (1.0, 1.0, 1.0)
    # a model config built without validation: its parameterisation is refused by name, not by a KeyError
    with pytest.raises(ValueError, match="unknown model.depth_param 'mup'; known: sp, depth_mup, completep"):
        depth.branch_multiplier(dataclasses.replace(cfg, depth_param="mup"))


@pytest.mark.parametrize("param,a", [("depth_mup", 0.5), ("completep", 1.0)])
def test_depth_param_sets_each_parameter_s_lr_and_eps(param, a):
    """The run's optimizer on gradients of eps's size (where eps matters), against optax.adamw
    with eps x m^-a, its blocks' updates x m^(a - 1) and the rest's as they are (m = 8 / 4)."""
    cfg = edit(BASE, model={"n_layer": 8, "depth_param": param, "depth_base": 4}, prores={"schedule": "none"})
    m = 2.0
    params = model_lib.init(cfg.model, jax.random.key(0))["params"]
    keys = iter(jax.random.split(jax.random.key(2), 64))
    grads = jax.tree.map(lambda p: 1e-8 * jax.random.normal(next(keys), p.shape), params)
    tx = steps._tx_and_model(cfg)[0]
    got, _ = jax.jit(lambda g, p: tx.update(g, tx.init(p), p, step=jnp.int32(0)))(grads, params)
    after = jax.device_get(optax.apply_updates(params, got))
    want = hand_adamw_update(cfg, params, grads, eps=cfg.optim.eps * m ** -a)
    assert_updates(jax.device_get(params), after, want, [m ** (a - 1)] * 8)
    unscaled_eps = hand_adamw_update(cfg, params, grads)  # eps matters here: the base eps's step differs
    assert np.abs(unscaled_eps["lnf_scale"] - want["lnf_scale"]).max() > 1e-2 * np.abs(want["lnf_scale"]).max()


@pytest.mark.parametrize("param,a", [("depth_mup", 0.5), ("completep", 1.0)])
def test_with_prores_each_branch_is_alpha_times_the_multiplier(param, a):
    cfg = edit(BASE, model={"depth_param": param, "depth_base": 2})  # L = 3: m = 3 / 2
    scale_L = ALPHAS * np.float32(1.5 ** -a)
    np.testing.assert_allclose(prores.run_alphas(cfg, STEP), scale_L, rtol=1e-7)
    before, _, loss, model = one_step(cfg)
    # the train step's forward is the model's at those branch scales; two programs, measured equal for both
    # parameterisations, natively and under AVX2 (rtol: a float32 ulp or two of headroom)
    np.testing.assert_allclose(loss, loss_fn(before, model, BATCH, scale_L), rtol=1e-6)
    assert abs(loss - float(loss_fn(before, model, BATCH, ALPHAS))) > 1e-4


# refusals and resume


@pytest.mark.parametrize("setting,message", [
    (["prores.forward=false"], r"^prores.forward: false leaves alpha unused unless prores.scale_updates"),
    (["model.depth_param=mup"], r"^model.depth_param: unknown depth parameterisation 'mup'; known: sp, depth_mup"),
    (["model.depth_base=0"], r"^model.depth_base: must be >= 1"),
    (["prores.scale_updates=alpha_cube"], r"^prores.scale_updates: unknown update scaling 'alpha_cube'.*alpha_sq"),
])
def test_each_option_is_refused_in_one_line_where_it_cannot_work(setting, message):
    with pytest.raises(config_lib.ConfigError, match=message) as error:
        config_lib.validate(config_lib.override(Config(), setting))
    assert "\n" not in str(error.value)


def test_the_defaults_change_nothing():
    cfg = Config()
    assert (cfg.prores.forward, cfg.model.zero_init_out, cfg.model.depth_param) == (True, False, "sp")
    np.testing.assert_array_equal(prores.run_alphas(BASE, STEP), ALPHAS)


def test_resume_treats_the_new_keys_as_the_run_s_identity():
    saved = Config().to_dict()
    for section, key in (("prores", "forward"), ("model", "zero_init_out"), ("model", "depth_param"),
                         ("model", "depth_base")):
        del saved[section][key]  # a run saved before the keys existed: their defaults
    assert workdir.changed_settings(saved, Config().to_dict()) == ([], [])
    for setting in ("prores.forward=false", "model.zero_init_out=true", "model.depth_param=completep",
                    "model.depth_base=4"):
        now = config_lib.override(Config(), [setting, "prores.scale_updates=alpha"]).to_dict()
        identity, _ = workdir.changed_settings(saved, now)
        assert any(item.startswith(setting.split("=")[0] + " ") for item in identity), (setting, identity)
