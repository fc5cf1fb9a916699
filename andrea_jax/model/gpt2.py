"""model.family=gpt2: the GPT-2 block's layers and the model's ends, composed by transformer.py in
every placement (llama.py is the other family, with the same two functions).

    x = tok_embedding[ids] + pos_embedding[positions]
    for l in 1..L:  x = block_l(x)        # e.g. pre: x + a_l Attn(LN(x)), then x + a_l MLP(LN(x))
    logits = LN(x) @ tok_embedding.T     # tied head, over the padded vocabulary

- LayerNorm with gain and bias, through andrea_jax.kernels (`kernels.impl`: xla, pallas, triton);
- attention with the fused [q|k|v] kernel and biases, the GELU MLP with biases (layers.py);
- a learned position table of model.seq_len rows; the head is the token embedding, transposed.
"""
from __future__ import annotations

import jax.numpy as jnp
import flax.linen as nn

from andrea_jax import kernels
from andrea_jax.config import ModelConfig
from andrea_jax.model import layers
from andrea_jax.model.layers import STREAM_BTD, constrain, padded_vocab


def block_sublayers(matrix, vector, cfg: ModelConfig, norm_names, impl: str, cache, rope, segment_ids_BT=None):
    """Creates one GPT-2 block's parameters through the Block's `matrix` / `vector` factories and
    returns its (attend, mlp, norm, residual_norm); rope is None for this family; segment_ids_BT:
    data.document_mask's document ids, or None (layers.attention). Created in the
    spine's order (flax draws init keys in creation order): same seed, same init."""
    D, F = cfg.d_model, cfg.mlp_ratio * cfg.d_model
    zeros, ones = nn.initializers.zeros, nn.initializers.ones

    def layer_norm_params(name):
        return vector(f"{name}_scale", ones, D), vector(f"{name}_bias", zeros, D)

    norms = {"ln1": layer_norm_params("ln1")}
    qkv_kernel, qkv_bias = matrix("attn_qkv_kernel", (D, 3 * D)), vector("attn_qkv_bias", zeros, 3 * D)
    out_kernel, out_bias = matrix("attn_out_kernel", (D, D)), vector("attn_out_bias", zeros, D)
    norms["ln2"] = layer_norm_params("ln2")
    fc_kernel, fc_bias = matrix("mlp_fc_kernel", (D, F)), vector("mlp_fc_bias", zeros, F)
    proj_kernel, proj_bias = matrix("mlp_proj_kernel", (F, D)), vector("mlp_proj_bias", zeros, D)
    norms |= {name: layer_norm_params(name) for name in norm_names[2:]}
    qk_gains = layers.qk_norm_gains(vector, cfg)

    def attend(y_BTD):
        return layers.attention(y_BTD, qkv_kernel, qkv_bias, out_kernel, out_bias, cfg, cache, qk_gains=qk_gains,
                                segment_ids_BT=segment_ids_BT)

    def mlp(y_BTD):
        return layers.mlp(y_BTD, fc_kernel, fc_bias, proj_kernel, proj_bias, cfg, impl)

    def norm(name, x, y_dtype=None):
        return kernels.layer_norm(x, *norms[name], eps=cfg.ln_eps, impl=impl, y_dtype=y_dtype)

    def residual_norm(name, x, f, a, y_dtype=None):
        return kernels.residual_layer_norm(x, f, a, *norms[name], eps=cfg.ln_eps, impl=impl, y_dtype=y_dtype)

    return attend, mlp, norm, residual_norm


def spine(param, cfg: ModelConfig, tokens_BT, cache, impl: str, positions_BT=None):
    """The ends of the GPT-2 model: (x_BTD, None, head), x the token embedding plus the learned
    position embedding, head(x_BTD) the operands of the logits (y_BTD, w_DP), y the final LayerNorm
    and w the tied embedding over the padded vocabulary, both in the compute dtype. Positions:
    positions_BT when given (model.reset_positions), else the cache's, else 0..T-1."""
    named = nn.with_logical_partitioning
    normal = nn.initializers.normal(cfg.init_std)
    tok_embedding_VD = param("tok_embedding", named(normal, ("vocab", "embed")),
                             (cfg.vocab_size, cfg.d_model), jnp.float32)
    pos_embedding_SD = param("pos_embedding", named(normal, ("seq", "embed")),
                             (cfg.seq_len, cfg.d_model), jnp.float32)
    lnf_scale = param("lnf_scale", named(nn.initializers.ones, ("act_embed",)), (cfg.d_model,), jnp.float32)
    lnf_bias = param("lnf_bias", named(nn.initializers.zeros, ("act_embed",)), (cfg.d_model,), jnp.float32)
    T = tokens_BT.shape[1]
    if positions_BT is None and cache is not None:
        positions_BT = cache.positions_BT
    positions = pos_embedding_SD[:T] if positions_BT is None else pos_embedding_SD[positions_BT]
    # The lookup reads whole rows: with the table's D split (FSDP) XLA would instead gather
    # every token id and move the looked-up activations; gathering the weight is cheaper.
    table_VD = constrain(tok_embedding_VD, ("vocab", None))
    x_BTD = constrain((table_VD[tokens_BT] + positions).astype(jnp.float32), STREAM_BTD)

    def head(x_BTD):
        y_BTD = kernels.layer_norm(x_BTD, lnf_scale, lnf_bias, eps=cfg.ln_eps, impl=impl, y_dtype=cfg.dtype)
        V, P = cfg.vocab_size, padded_vocab(cfg.vocab_size)
        padded_PD = jnp.pad(tok_embedding_VD, ((0, P - V), (0, 0)))  # zero rows
        return y_BTD, padded_PD.T.astype(jnp.dtype(cfg.dtype))

    return x_BTD, None, head
