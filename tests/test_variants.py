"""Norm placements, inits and learned gates against the ProRes paper's Table 1, transcribed independently in
tests/_ref_blocks.py; the pre-LN model against a frozen copy of the spine's forward pass. (The
whole model of every placement against the transcribed loop: tests/test_diagnostics.py.)"""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import _ref_blocks as ref
from _helpers import perturbed_params
from andrea_jax import config as config_lib, configs
from andrea_jax import model as model_lib
from andrea_jax.config import ModelConfig
from andrea_jax.configs import andrea_120m

SMALL = ModelConfig(vocab_size=300, seq_len=16, d_model=32, n_layer=5, n_head=4)


def variant(**changes) -> ModelConfig:
    return dataclasses.replace(SMALL, **changes)


def block_input(cfg, B=2, T=12, seed=3):
    return jax.random.normal(jax.random.key(seed), (B, T, cfg.d_model))


@pytest.mark.parametrize("norm", config_lib.NORMS)
def test_block_matches_the_formula_of_its_row(norm):
    cfg = variant(norm=norm)
    params = perturbed_params(cfg)
    x = block_input(cfg)
    layer = 3  # LNS divides by sqrt(l); DeepNorm's c depends on L = 5
    p = jax.tree.map(lambda v: v[layer - 1], params["blocks"])
    got, (stats, kv) = model_lib.Block(cfg).apply({"params": p}, x, (jnp.float32(0.7), jnp.int32(layer)))
    assert stats is None and kv is None  # no diagnostics unless asked, no cache unless given
    want, _ = ref.block(norm, p, x, 0.7, layer, cfg.n_layer, cfg.n_head)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    # The transcriptions differ from each other: a wrong table entry could not pass.
    others = [ref.block(o, p | {"ln1_out_scale": p["ln1_scale"], "ln1_out_bias": p["ln1_bias"],
                                "ln2_out_scale": p["ln2_scale"], "ln2_out_bias": p["ln2_bias"]},
                        x, 0.7, layer, cfg.n_layer, cfg.n_head)[0]
              for o in config_lib.NORMS if o != norm]
    assert all(not np.allclose(got, o, atol=1e-3) for o in others)


def spine_forward(params, tokens, alphas, n_head, eps=1e-5):
    """Frozen copy of the spine's model (commit ced9203) in plain jnp: pre-LN, the attention
    residual fused into the MLP norm, tanh GELU, final norm, tied output."""
    def ln(x, g, b):
        m = x.mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * g + b

    T = tokens.shape[1]
    x = params["tok_embedding"][tokens] + params["pos_embedding"][:T]
    blocks = params["blocks"]
    for l in range(len(alphas)):
        p = {k: v[l] for k, v in blocks.items()}
        B, _, D = x.shape
        qkv = ln(x, p["ln1_scale"], p["ln1_bias"]) @ p["attn_qkv_kernel"] + p["attn_qkv_bias"]
        q, k, v = (t.reshape(B, T, n_head, D // n_head) for t in jnp.split(qkv, 3, axis=-1))
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(B, T, D)
        x = x + alphas[l] * (o @ p["attn_out_kernel"] + p["attn_out_bias"])
        u = ln(x, p["ln2_scale"], p["ln2_bias"]) @ p["mlp_fc_kernel"] + p["mlp_fc_bias"]
        h = 0.5 * u * (1 + jnp.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))
        x = x + alphas[l] * (h @ p["mlp_proj_kernel"] + p["mlp_proj_bias"])
    return ln(x, params["lnf_scale"], params["lnf_bias"]) @ params["tok_embedding"].T


@pytest.mark.parametrize("alphas", [[1.0] * 5, [0.0, 0.25, 1.0, 0.5, 0.75]])
def test_pre_ln_model_equals_the_spines_model(alphas):
    params = perturbed_params(SMALL)
    tokens = jax.random.randint(jax.random.key(7), (2, 12), 0, SMALL.vocab_size)
    got = model_lib.Andrea(SMALL).apply({"params": params}, tokens, jnp.array(alphas)).logits
    np.testing.assert_allclose(got, spine_forward(params, tokens, alphas, SMALL.n_head), rtol=1e-5, atol=1e-5)


def test_parameter_counts():
    cfg = andrea_120m.get_config().model
    assert (cfg.norm, cfg.init, cfg.gates) == ("pre", "normal", "none")
    assert model_lib.count_params(cfg) == 92_331_264
    for norm in ("post", "deepnorm", "lns"):  # same tree: two norms per block
        assert model_lib.count_params(dataclasses.replace(cfg, norm=norm)) == 92_331_264
    # Sandwich: two more LayerNorms (gain + bias of 768) per block; learned gates: one scalar per block.
    assert model_lib.count_params(dataclasses.replace(cfg, norm="sandwich")) == 92_331_264 + 12 * 2 * 2 * 768
    assert model_lib.count_params(dataclasses.replace(cfg, gates="learned")) == 92_331_264 + 12


def test_learned_gate_starts_as_identity_and_is_the_only_block_parameter_that_learns():
    cfg = variant(gates="learned")
    params = model_lib.init(cfg, jax.random.key(0))["params"]
    assert params["blocks"]["residual_gate"].shape == (cfg.n_layer,)
    assert np.all(np.asarray(params["blocks"]["residual_gate"]) == 0.0)
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, cfg.vocab_size)
    ones = jnp.ones((cfg.n_layer,))
    x = params["tok_embedding"][tokens] + params["pos_embedding"][:12]
    want = ref.layer_norm(x, params, "lnf") @ params["tok_embedding"].T
    np.testing.assert_allclose(model_lib.Andrea(cfg).apply({"params": params}, tokens, ones).logits, want,
                               rtol=1e-5, atol=1e-5)
    grads = jax.jit(jax.grad(lambda p: model_lib.Andrea(cfg).apply({"params": p}, tokens, ones).logits.sum()))(params)
    for name, g in grads["blocks"].items():
        if name == "residual_gate":  # ReZero: d loss / d g = <dL/dx, F(x)>, non-zero from the start
            assert np.all(np.asarray(g) != 0.0)
        else:
            assert np.all(np.asarray(g) == 0.0), name


def test_learned_gate_multiplies_the_prores_alpha():
    cfg = variant(gates="learned")
    params = perturbed_params(cfg)
    x = block_input(cfg)
    p = jax.tree.map(lambda v: v[1], params["blocks"])
    p["residual_gate"] = jnp.float32(0.4)
    got, _ = model_lib.Block(cfg).apply({"params": p}, x, (jnp.float32(0.5), jnp.int32(2)))
    want, _ = ref.block("pre", p, x, 0.5 * 0.4, 2, cfg.n_layer, cfg.n_head)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


# --- inits ------------------------------------------------------------------------------------
# D = 256: attn_out has 65,536 entries, mlp_proj 262,144; the relative standard error of an
# empirical std is 1/sqrt(2n) < 0.3%, so a 3% bound is > 10 standard errors wide while the
# per-layer stds differ between layers by far more than 3%.
INIT = ModelConfig(vocab_size=257, seq_len=8, d_model=256, n_layer=6, n_head=4)


def block_kernels(init):
    cfg = dataclasses.replace(INIT, init=init)
    return cfg, jax.tree.map(np.asarray, model_lib.init(cfg, jax.random.key(11))["params"]["blocks"])


def assert_std(values, want, what):
    got = float(np.std(values))
    assert abs(got / want - 1) < 0.03, f"{what}: std {got:.5f}, want {want:.5f}"


def test_normal_init():
    cfg, blocks = block_kernels("normal")
    for name in ("attn_qkv_kernel", "attn_out_kernel", "mlp_fc_kernel", "mlp_proj_kernel"):
        for l in (0, cfg.n_layer - 1):
            assert_std(blocks[name][l], 0.02, f"{name}[{l}]")


def test_scaled_init_divides_output_projections_by_sqrt_2L():
    cfg, blocks = block_kernels("scaled")
    for name in model_lib.OUTPUT_PROJECTIONS:
        for l in range(cfg.n_layer):
            assert_std(blocks[name][l], 0.02 / math.sqrt(2 * cfg.n_layer), f"{name}[{l}]")
    assert_std(blocks["mlp_fc_kernel"][0], 0.02, "mlp_fc_kernel")


def test_ds_init_divides_output_projections_of_layer_l_by_sqrt_2l():
    cfg, blocks = block_kernels("ds")
    for name in model_lib.OUTPUT_PROJECTIONS:
        stds = [float(np.std(blocks[name][l - 1])) for l in range(1, cfg.n_layer + 1)]
        for l in range(1, cfg.n_layer + 1):
            assert_std(blocks[name][l - 1], 0.02 / math.sqrt(2 * l), f"{name} layer {l}")
        # The per-layer ratio follows sqrt(l): std_1 / std_l = sqrt(l), never constant.
        np.testing.assert_allclose(stds[0] / np.array(stds), np.sqrt(np.arange(1, cfg.n_layer + 1)), rtol=0.04)
    for name in ("attn_qkv_kernel", "mlp_fc_kernel"):
        assert_std(blocks[name][cfg.n_layer - 1], 0.02, name)


def test_deepnorm_init_is_xavier_with_gain_on_ffn_value_and_output():
    cfg, blocks = block_kernels("deepnorm")
    D, F, L = cfg.d_model, 4 * cfg.d_model, cfg.n_layer
    beta = (8 * L) ** -0.25
    for l in (0, L - 1):
        qkv = blocks["attn_qkv_kernel"][l]
        assert_std(qkv[:, :2 * D], math.sqrt(2 / (D + D)), "q and k: Xavier, gain 1")
        assert_std(qkv[:, 2 * D:], beta * math.sqrt(2 / (D + D)), "v: Xavier, gain beta")
        assert_std(blocks["attn_out_kernel"][l], beta * math.sqrt(2 / (D + D)), "attn out")
        assert_std(blocks["mlp_fc_kernel"][l], beta * math.sqrt(2 / (D + F)), "mlp fc")
        assert_std(blocks["mlp_proj_kernel"][l], beta * math.sqrt(2 / (F + D)), "mlp proj")


def test_unknown_variant_names_its_key():
    cfg = config_lib.Config()
    for key, value in (("model.norm", "rms"), ("model.init", "xavier"), ("model.gates", "yes")):
        with pytest.raises(config_lib.ConfigError, match=key.replace(".", r"\.")):
            config_lib.validate(config_lib.override(cfg, [f"{key}={value}"]))


@pytest.mark.parametrize("family", ["71m", "tiny"])
def test_depth_sweep_configs(family):
    depths = (12, 24, 48, 72, 96, 120)
    members = [config_lib.validate(configs.load(f"depth:family={family},layers={L}")) for L in depths]
    assert [c.model.n_layer for c in members] == list(depths)
    width = {"71m": (512, 8), "tiny": (64, 4)}[family]
    assert all((c.model.d_model, c.model.n_head) == width for c in members)
    assert all(c.diagnostics.every > 0 for c in members)
    # ProRes T: the paper's 1000 (500 at 96 and 120 layers) of 100k steps; tiny scales that to 1%
    # (0.5%) of its 300 steps, rounded to whole steps.
    want = {"71m": [1000] * 4 + [500] * 2, "tiny": [3] * 4 + [2] * 2}[family]
    assert [c.prores.warmup for c in members] == want
    assert all(c.train.steps == {"71m": 100_000, "tiny": 300}[family] for c in members)


@pytest.mark.parametrize("arg", ["", "family=tiny", "family=tiny,layers=13", "family=big,layers=12",
                                 "family=tiny,layers=12,width=3"])
def test_depth_config_refuses_a_bad_argument(arg):
    with pytest.raises(config_lib.ConfigError, match="config depth"):
        configs.load(f"depth:{arg}" if arg else "depth")
