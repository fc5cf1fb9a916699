"""ANDREA: a GPT-2-style pre-norm decoder whose blocks are scaled by ProRes alphas.

    x = tok_embedding[ids] + pos_embedding[positions]
    for l in 1..L:  x = x + alpha_l * Attn(LN(x));  x = x + alpha_l * MLP(LN(x))
    logits = LN(x) @ tok_embedding.T

The block stack is one `nn.scan` over `Block`: parameters are stacked on a leading layer axis,
the carry is the residual stream and the scanned input is (alpha_l, l). The model knows nothing
of steps, data or optimizers: `Andrea(cfg).apply(variables, tokens_BT, alphas_L)` is the whole
contract. Parameters are float32; activations run in `cfg.dtype`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import flax.linen as nn

import kernels
from andrea_jax.config import ModelConfig


class Block(nn.Module):
    """One pre-norm block; `__call__(x_BTD, (alpha, l)) -> (x_BTD, None)` is the scan body."""
    cfg: ModelConfig
    impl: str = "auto"

    @nn.compact
    def __call__(self, x_BTD, scanned):
        alpha, _layer = scanned  # the 1-based layer index is scanned in for per-layer variants
        cfg = self.cfg
        D, H = cfg.d_model, cfg.n_head
        F = cfg.mlp_ratio * D
        dtype = jnp.dtype(cfg.dtype)
        normal = nn.initializers.normal(cfg.init_std)
        zeros, ones = nn.initializers.zeros, nn.initializers.ones
        param = lambda name, init, shape: self.param(name, init, shape, jnp.float32)

        ln1_scale, ln1_bias = param("ln1_scale", ones, (D,)), param("ln1_bias", zeros, (D,))
        qkv_kernel, qkv_bias = param("attn_qkv_kernel", normal, (D, 3 * D)), param("attn_qkv_bias", zeros, (3 * D,))
        out_kernel, out_bias = param("attn_out_kernel", normal, (D, D)), param("attn_out_bias", zeros, (D,))
        ln2_scale, ln2_bias = param("ln2_scale", ones, (D,)), param("ln2_bias", zeros, (D,))
        fc_kernel, fc_bias = param("mlp_fc_kernel", normal, (D, F)), param("mlp_fc_bias", zeros, (F,))
        proj_kernel, proj_bias = param("mlp_proj_kernel", normal, (F, D)), param("mlp_proj_bias", zeros, (D,))

        B, T, _ = x_BTD.shape
        y_BTD = kernels.layer_norm(x_BTD, ln1_scale, ln1_bias, eps=cfg.ln_eps, impl=self.impl)
        qkv_BT3D = y_BTD @ qkv_kernel.astype(dtype) + qkv_bias.astype(dtype)
        q_BTHK, k_BTHK, v_BTHK = (a.reshape(B, T, H, D // H) for a in jnp.split(qkv_BT3D, 3, axis=-1))
        o_BTHK = jax.nn.dot_product_attention(q_BTHK, k_BTHK, v_BTHK, is_causal=True)
        attn_BTD = o_BTHK.reshape(B, T, D) @ out_kernel.astype(dtype) + out_bias.astype(dtype)

        # The attention residual add is fused into the MLP's LayerNorm.
        x_BTD, y_BTD = kernels.residual_layer_norm(
            x_BTD, attn_BTD, alpha, ln2_scale, ln2_bias, eps=cfg.ln_eps, impl=self.impl)
        h_BTF = kernels.bias_gelu(y_BTD @ fc_kernel.astype(dtype), fc_bias, impl=self.impl)
        mlp_BTD = h_BTF @ proj_kernel.astype(dtype) + proj_bias.astype(dtype)
        x_BTD = x_BTD + alpha.astype(dtype) * mlp_BTD
        return x_BTD, None


class Andrea(nn.Module):
    cfg: ModelConfig
    impl: str = "auto"

    @nn.compact
    def __call__(self, tokens_BT, alphas_L):
        cfg = self.cfg
        dtype = jnp.dtype(cfg.dtype)
        normal = nn.initializers.normal(cfg.init_std)
        tok_embedding_VD = self.param("tok_embedding", normal, (cfg.vocab_size, cfg.d_model), jnp.float32)
        pos_embedding_SD = self.param("pos_embedding", normal, (cfg.seq_len, cfg.d_model), jnp.float32)
        lnf_scale = self.param("lnf_scale", nn.initializers.ones, (cfg.d_model,), jnp.float32)
        lnf_bias = self.param("lnf_bias", nn.initializers.zeros, (cfg.d_model,), jnp.float32)

        T = tokens_BT.shape[1]
        if T > cfg.seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than model.seq_len={cfg.seq_len}")
        x_BTD = (tok_embedding_VD[tokens_BT] + pos_embedding_SD[:T]).astype(dtype)

        block = nn.remat(Block, prevent_cse=False) if cfg.remat else Block
        stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                        in_axes=0, length=cfg.n_layer)
        layers_L = jnp.arange(1, cfg.n_layer + 1, dtype=jnp.int32)
        x_BTD, _ = stack(cfg, self.impl, name="blocks")(x_BTD, (jnp.asarray(alphas_L, jnp.float32), layers_L))

        y_BTD = kernels.layer_norm(x_BTD, lnf_scale, lnf_bias, eps=cfg.ln_eps, impl=self.impl)
        return jnp.einsum("btd,vd->btv", y_BTD, tok_embedding_VD.astype(dtype))


def init(cfg: ModelConfig, rng, impl: str = "auto"):
    """Returns the variables of a freshly initialised model."""
    tokens = jnp.zeros((1, min(8, cfg.seq_len)), jnp.int32)
    return Andrea(cfg, impl).init(rng, tokens, jnp.ones((cfg.n_layer,), jnp.float32))


def param_shapes(cfg: ModelConfig):
    """The parameter tree as ShapeDtypeStructs, without allocating anything."""
    return jax.eval_shape(lambda rng: init(cfg, rng), jax.random.key(0))["params"]


def count_params(cfg: ModelConfig) -> int:
    return sum(int(p.size) for p in jax.tree.leaves(param_shapes(cfg)))


def flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> float:
    """Training FLOPs per token (forward + backward = 3x forward), matmuls only.

    6 x (matmul parameters, the tied output projection included) + 12 L T D for attention
    scores and values (causal masking not discounted, as in PaLM's MFU convention).
    """
    T = seq_len or cfg.seq_len
    D, L, F, V = cfg.d_model, cfg.n_layer, cfg.mlp_ratio * cfg.d_model, cfg.vocab_size
    matmul_params = L * (D * 3 * D + D * D + 2 * D * F) + V * D
    return 6.0 * matmul_params + 12.0 * L * T * D
