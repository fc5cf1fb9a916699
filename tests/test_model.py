"""The model against independent references: parameter count, an unscanned loop, causality, and
the ProRes identity (alpha = 0 => block is the identity and its parameters get zero gradient)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import model as model_lib
from andrea_jax.config import ModelConfig
from andrea_jax.configs import andrea_120m
from andrea_jax.kernels import reference

import _ref_blocks as ref

SMALL = ModelConfig(vocab_size=300, seq_len=16, d_model=32, n_layer=3, n_head=4)


def setup(cfg=SMALL, B=2, T=12, seed=0):
    params = model_lib.init(cfg, jax.random.key(seed))["params"]
    # Perturb LayerNorm gains/biases and biases so that the tests see them (init is ones/zeros).
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    leaves = [p + 0.1 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)]
    params = jax.tree.unflatten(tree, leaves)
    tokens = jax.random.randint(jax.random.key(seed + 2), (B, T), 0, cfg.vocab_size)
    return params, tokens


def apply(params, tokens, alphas, cfg=SMALL):
    return model_lib.Andrea(cfg).apply({"params": params}, tokens, jnp.asarray(alphas, jnp.float32)).logits


def test_andrea_120m_parameter_count_and_layernorms_without_allocating():
    cfg = andrea_120m.get_config().model
    shapes = model_lib.param_shapes(cfg)
    assert all(isinstance(p, jax.ShapeDtypeStruct) for p in jax.tree.leaves(shapes))
    assert sum(int(np.prod(p.shape)) for p in jax.tree.leaves(shapes)) == 92_331_264
    assert model_lib.count_params(cfg) == 92_331_264
    block_norms = [n for n in shapes["blocks"] if n.startswith("ln") and n.endswith("_scale")]
    n_norms = sum(shapes["blocks"][n].shape[0] for n in block_norms) + ("lnf_scale" in shapes)
    assert n_norms == 25
    assert shapes["tok_embedding"].shape == (8449, 768)
    assert "lm_head" not in str(shapes)  # tied: no separate output matrix


def unscanned_forward(params, tokens, alphas, norm):
    """The paper's formulas as a plain Python loop over per-layer slices of the stacked block
    parameters (tests/_ref_blocks.py: jnp only, no flax Block, no kernels, no scan)."""
    logits, _ = ref.forward(norm, params, tokens, jnp.asarray(alphas, jnp.float32), SMALL.n_head)
    return logits


@pytest.mark.parametrize("norm", ["pre", "lns"])  # lns reads the layer index l that the scan carries
def test_scanned_model_equals_unscanned_loop(norm):
    params, tokens = setup()
    alphas = [0.3, 1.0, 0.7]  # distinct per layer: a block given another layer's alpha shows
    got = apply(params, tokens, alphas, dataclasses.replace(SMALL, norm=norm))
    # measured max |difference| 1.0e-6 (pre) and 7.2e-7 (lns) on logits up to 2.4: float32
    # rounding of the kernels' fused LayerNorm against the written-out formula
    np.testing.assert_allclose(got, unscanned_forward(params, tokens, alphas, norm), rtol=0, atol=1e-5)
    # the comparison can fail: the same loop with the alphas in reverse order is 1.2 - 1.4 away
    assert np.abs(np.asarray(got) - np.asarray(unscanned_forward(params, tokens, alphas[::-1], norm))).max() > 0.1


def test_remat_changes_nothing():
    params, tokens = setup()
    remat_cfg = ModelConfig(**{**SMALL.__dict__, "remat": True})
    alphas = jnp.array([0.3, 1.0, 0.7])
    loss = lambda p, cfg: apply(p, tokens, alphas, cfg).sum()
    np.testing.assert_allclose(loss(params, remat_cfg), loss(params, SMALL), rtol=1e-6)
    g1, g2 = jax.grad(loss)(params, remat_cfg), jax.grad(loss)(params, SMALL)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        # Remat reorders float32 sums: measured differences are ~1e-8 of the largest gradient.
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * float(np.abs(b).max()))


def test_causality():
    params, tokens = setup(T=12)
    logits = apply(params, tokens, [1.0, 1.0, 1.0])
    for t in (0, 5, 10):
        changed = tokens.at[:, t + 1:].set((tokens[:, t + 1:] + 7) % SMALL.vocab_size)
        other = apply(params, changed, [1.0, 1.0, 1.0])
        # exact by construction: the same executables, and the masked scores add exact zeros
        np.testing.assert_array_equal(np.asarray(other[:, : t + 1]), np.asarray(logits[:, : t + 1]))
        assert not np.allclose(other[:, t + 1:], logits[:, t + 1:])


def test_all_alphas_zero_is_identity_with_zero_block_gradients():
    params, tokens = setup()
    logits = apply(params, tokens, [0.0, 0.0, 0.0])
    x = params["tok_embedding"][tokens] + params["pos_embedding"][: tokens.shape[1]]
    want = reference.layer_norm(x, params["lnf_scale"], params["lnf_bias"]) @ params["tok_embedding"].T
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)

    grads = jax.grad(lambda p: apply(p, tokens, [0.0, 0.0, 0.0]).sum())(params)
    for name, g in grads["blocks"].items():
        assert np.all(np.asarray(g) == 0.0), name
    assert np.any(np.asarray(grads["tok_embedding"]) != 0)


@pytest.mark.parametrize("off", [0, 1, 2])
def test_one_alpha_zero_freezes_only_that_layer(off):
    params, tokens = setup()
    alphas = jnp.ones(3).at[off].set(0.0)
    grads = jax.grad(lambda p: apply(p, tokens, alphas).sum())(params)
    for name, g in grads["blocks"].items():
        g = np.asarray(g)
        assert np.all(g[off] == 0.0), (name, off)
        others = [l for l in range(3) if l != off]
        assert all(np.any(g[l] != 0.0) for l in others), (name, off)


def test_bfloat16_compute_keeps_float32_params_and_tracks_float32():
    params, tokens = setup()
    bf16 = ModelConfig(**{**SMALL.__dict__, "dtype": "bfloat16"})
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(model_lib.init(bf16, jax.random.key(0))))
    out16 = apply(params, tokens, [1.0, 0.5, 0.2], bf16)
    out32 = apply(params, tokens, [1.0, 0.5, 0.2])
    assert out16.dtype == jnp.float32  # the logits matmul accumulates in float32
    diff = np.abs(np.asarray(out16, np.float32) - np.asarray(out32))
    # bf16 has 8 bits of mantissa (half an ulp at 2 is 7.8e-3). Measured max |difference| 1.34e-2
    # on logits up to 2.13 (rms difference 3.3e-3; setup's seeds 1-3: 1.40e-2 to 1.54e-2).
    assert diff.max() < 3e-2, diff.max()
    # measured correlation 0.999985 (1 - r = 1.5e-5)
    assert np.corrcoef(np.asarray(out16, np.float32).ravel(), np.asarray(out32).ravel())[0, 1] > 0.9999
    # and the compute really is bf16: a model that ignored model.dtype would give 0 here
    assert diff.max() > 1e-3, diff.max()


def test_bf16_logits_backward_runs_bf16_matmuls_with_float32_accumulation():
    """The head's matmul: float32 logits from bf16 operands, and a backward whose two matmuls take
    bf16 operands (the cotangent cast once) accumulating in float32, not float32 x float32 ones."""
    from andrea_jax.model import layers

    rng = np.random.default_rng(0)
    y = jnp.asarray(rng.normal(size=(2, 64, 96)), jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=(96, 256)) * 0.1, jnp.bfloat16)
    target = jnp.asarray(rng.normal(size=(2, 64, 256)), jnp.float32)
    loss = lambda f: lambda y, w: jnp.sum(jnp.square(f(y, w) - target))
    plain = lambda y, w: layers.token_matmul(y, w, preferred_element_type=jnp.float32)
    assert layers.logits_matmul(y, w).dtype == jnp.float32
    # same forward, exact by construction: the custom_vjp's forward is token_matmul itself
    np.testing.assert_array_equal(layers.logits_matmul(y, w), plain(y, w))

    # the backward's matmuls are the grad's own equations (the forward sits in the custom_vjp call)
    jaxpr = jax.make_jaxpr(jax.grad(loss(layers.logits_matmul), argnums=(0, 1)))(y, w)
    backward = [(tuple(str(v.aval.dtype) for v in e.invars), str(e.params["preferred_element_type"]))
                for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    assert backward == [(("bfloat16", "bfloat16"), "float32")] * 2, backward

    # gradients against autodiff's float32-cotangent ones: the cotangent rounded to bf16 once
    # (2^-9 relative) and the results rounded to bf16 (2^-9): measured 4.1e-3 (dy) and 5.2e-3 (dw)
    # of max|g| here
    got = jax.grad(loss(layers.logits_matmul), argnums=(0, 1))(y, w)
    want = jax.grad(loss(plain), argnums=(0, 1))(y, w)
    for g, r in zip(got, want):
        assert g.dtype == jnp.bfloat16
        g32, r32 = g.astype(jnp.float32), r.astype(jnp.float32)
        err = float(jnp.max(jnp.abs(g32 - r32)) / jnp.max(jnp.abs(r32)))
        assert err < 1e-2, err
    # float32 operands: logits_matmul is token_matmul, the same program: gradients bit for bit
    y32, w32 = y.astype(jnp.float32), w.astype(jnp.float32)
    for g, r in zip(jax.grad(loss(layers.logits_matmul), argnums=(0, 1))(y32, w32),
                    jax.grad(loss(plain), argnums=(0, 1))(y32, w32)):
        np.testing.assert_array_equal(g, r)
