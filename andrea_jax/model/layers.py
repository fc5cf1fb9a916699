"""The layers of a block and their layout: logical axis names, the token matmul, causal
self-attention (with its KV cache) and the GELU MLP. Pure functions of arrays and parameters;
the flax modules that own the parameters are in transformer.py.

Partitioning: every parameter carries logical axis names (`andrea_jax.names.LOGICAL_AXES`; the layer
scan adds `layers` in front of a block's), and so do the key activations, through
`nn.with_logical_constraint`. The names say what a dimension is, not where it goes: the one table
that maps them to mesh axes is `andrea_jax.names.RULES`. Without `nn.logical_axis_rules`
in context the constraints do nothing, so single-device use (tests, inference, decoding) is
unaffected.
"""
from __future__ import annotations

import typing

import jax
import jax.numpy as jnp
import flax.linen as nn

from andrea_jax import kernels
from andrea_jax.config import ModelConfig


# Names of the dimensions of the parameters that `attention` and `mlp` below take, for the
# families whose blocks use them (each family's BLOCK_PARAM_AXES; the layer scan puts `layers`
# first). Biases added to the residual stream live on its width.
ATTENTION_PARAM_AXES = {"attn_qkv_kernel": ("embed", "qkv"), "attn_qkv_bias": ("qkv",),
                        "attn_out_kernel": ("heads", "embed"), "attn_out_bias": ("act_embed",),
                        # model.qk_norm: gains over a head's K dimensions, shared by the heads
                        "attn_q_norm_scale": (None,), "attn_k_norm_scale": (None,)}
MLP_PARAM_AXES = {"mlp_fc_kernel": ("embed", "mlp"), "mlp_fc_bias": ("mlp",),
                  "mlp_proj_kernel": ("mlp", "embed"), "mlp_proj_bias": ("act_embed",)}
STREAM_BTD = ("batch", "seq", "act_embed")  # the residual stream, the scan's carry


def constrain(x, names):
    """Pins x's layout by logical names; a no-op unless axis rules and a mesh are in context."""
    return nn.with_logical_constraint(x, names)


def token_matmul(x_BTI, w_I_O, **kwargs):
    """x @ w contracting x's last axis with w's first, the tokens flattened into the rows of one
    2-D matrix. The same products as on [B, T, I]; but the weight's gradient then contracts one
    axis (rows) instead of two (batch, seq), and XLA's CPU backend runs that dot on its operands
    as they lie, where for two axes it first copies the cotangent into a transposed buffer: one
    copy per projection per layer, and one of the whole logits (benchmarks/
    profile_backward.py shows them)."""
    *lead, I = x_BTI.shape
    out = jnp.tensordot(x_BTI.reshape(-1, I), w_I_O, axes=1, **kwargs)
    return out.reshape(*lead, *w_I_O.shape[1:])


def logits_matmul(y_BTD, w_DP):
    """The head's y @ w with float32 outputs (the softmax's input), the operands in the compute dtype.

    Autodiff of a dot with preferred_element_type=float32 gives a float32 cotangent, which upcasts
    the bf16 operands of both backward matmuls ([B T, P] x [P, D] and [D, B T] x [B T, P], ~5% of
    the step's FLOPs at andrea_120m) to float32 x float32. Here the backward casts the cotangent
    to the compute dtype, as every other matmul's cotangent already is, and accumulates in float32:
    bf16 operands, float32 accumulation, the forward's numerics unchanged. With float32 operands
    this is the plain dot."""
    if y_BTD.dtype == jnp.float32 and w_DP.dtype == jnp.float32:
        return token_matmul(y_BTD, w_DP, preferred_element_type=jnp.float32)
    return _low_precision_logits(y_BTD, w_DP)


@jax.custom_vjp
def _low_precision_logits(y_BTD, w_DP):
    return token_matmul(y_BTD, w_DP, preferred_element_type=jnp.float32)


def _low_precision_logits_fwd(y_BTD, w_DP):
    return _low_precision_logits(y_BTD, w_DP), (y_BTD, w_DP)


def _low_precision_logits_bwd(res, g_BTP):
    y_BTD, w_DP = res
    g_BTP = g_BTP.astype(y_BTD.dtype)
    dy_BTD = token_matmul(g_BTP, w_DP.T, preferred_element_type=jnp.float32).astype(y_BTD.dtype)
    D, P = w_DP.shape
    dw_DP = jnp.tensordot(y_BTD.reshape(-1, D), g_BTP.reshape(-1, P), axes=((0,), (0,)),
                          preferred_element_type=jnp.float32).astype(w_DP.dtype)
    return dy_BTD, dw_DP


_low_precision_logits.defvjp(_low_precision_logits_fwd, _low_precision_logits_bwd)


def rms_norm(x, gain, *, eps: float):
    """x / sqrt(mean(x^2) + eps) * gain over the last axis; statistics in float32, output in x's dtype."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return (y * gain.astype(jnp.float32)).astype(x.dtype)


def qk_norm_gains(vector, cfg: ModelConfig):
    """model.qk_norm: the block's (q_gain_K, k_gain_K), ones, created through its `vector`
    factory; None when off."""
    if not cfg.qk_norm:
        return None
    K = cfg.d_model // cfg.n_head
    return tuple(vector(f"attn_{x}_norm_scale", nn.initializers.ones, K) for x in "qk")


VOCAB_ALIGN = 128  # the logits matmul runs over the vocabulary padded to a multiple of this


def padded_vocab(vocab_size: int) -> int:
    return -(-vocab_size // VOCAB_ALIGN) * VOCAB_ALIGN


def attention_impl(cfg: ModelConfig) -> tuple[str, str]:
    """(implementation for jax.nn.dot_product_attention, why): cuDNN flash attention where it can
    run (a GPU, bf16, head dim a multiple of 8 up to 128), XLA's attention otherwise."""
    head_dim = cfg.d_model // cfg.n_head
    if cfg.attention == "xla":
        return "xla", "model.attention=xla"
    blockers = [why for bad, why in (
        (kernels.target_backend() != "gpu", f"no GPU (backend {kernels.target_backend()})"),
        (cfg.dtype != "bfloat16", f"model.dtype={cfg.dtype} (cuDNN flash attention needs bfloat16)"),
        (head_dim % 8 or head_dim > 128, f"head dim {head_dim} (cuDNN needs a multiple of 8, at most 128)"),
    ) if bad]
    if blockers:
        return "xla", f"model.attention={cfg.attention} falls back to xla: " + "; ".join(blockers)
    return "cudnn", f"model.attention={cfg.attention}: cuDNN flash attention"


class KVCache(typing.NamedTuple):
    """What one cached forward pass needs besides the tokens (see the module docstring)."""
    k_LBSHK: jnp.ndarray     # keys of every layer, S = model.seq_len slots
    v_LBSHK: jnp.ndarray
    index: jnp.ndarray       # int32 scalar: the slot of tokens_BT[:, 0]; slots index .. index+T-1 are written
    positions_BT: jnp.ndarray  # int32 position of each token (left padding makes them differ per row)
    valid_BS: jnp.ndarray    # bool: slots that hold real tokens once this call has written its own


def empty_cache(cfg: ModelConfig, batch: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Zeroed (k_LBSHK, v_LBSHK) for `batch` rows, in the compute dtype."""
    shape = (cfg.n_layer, batch, cfg.seq_len, cfg.n_head, cfg.d_model // cfg.n_head)
    return jnp.zeros(shape, cfg.dtype), jnp.zeros(shape, cfg.dtype)


def cached_attention(q_BTHK, k_BTHK, v_BTHK, k_cache_BSHK, v_cache_BSHK, index, valid_BS):
    """Writes k, v at slots index.., then attends causally over the valid slots of the cache."""
    k_cache_BSHK = jax.lax.dynamic_update_slice(k_cache_BSHK, k_BTHK.astype(k_cache_BSHK.dtype), (0, index, 0, 0))
    v_cache_BSHK = jax.lax.dynamic_update_slice(v_cache_BSHK, v_BTHK.astype(v_cache_BSHK.dtype), (0, index, 0, 0))
    T, S = q_BTHK.shape[1], k_cache_BSHK.shape[1]
    query_slot_T1 = (index + jnp.arange(T))[:, None]
    key_slot_1S = jnp.arange(S)[None, :]
    # A padded query still sees itself, so that no softmax row is empty (its output is never used).
    mask_BTS = (key_slot_1S <= query_slot_T1) & (valid_BS[:, None, :] | (key_slot_1S == query_slot_T1))
    o_BTHK = jax.nn.dot_product_attention(q_BTHK, k_cache_BSHK.astype(q_BTHK.dtype),
                                          v_cache_BSHK.astype(q_BTHK.dtype), mask=mask_BTS[:, None])
    return o_BTHK, (k_cache_BSHK, v_cache_BSHK)


def document_mask(segment_ids_BT):
    """[B, 1, T, T] bool: query t sees key s when s <= t and both lie in the same document."""
    T = segment_ids_BT.shape[1]
    causal_TT = jnp.arange(T)[None, :] <= jnp.arange(T)[:, None]
    same_BTT = segment_ids_BT[:, :, None] == segment_ids_BT[:, None, :]
    return (causal_TT & same_BTT)[:, None]


def attention(y_BTD, qkv_kernel, qkv_bias, out_kernel, out_bias, cfg: ModelConfig, cache=None, rotate=None,
              qk_gains=None, segment_ids_BT=None):
    """Causal multi-head self-attention of the fused [q|k|v] projection, computed in cfg.dtype.
    cache: None, or (k_cache_BSHK, v_cache_BSHK, index, valid_BS); then returns (out, (k, v))
    with the cache slices updated, else (out, None). The biases may be None (llama has none);
    rotate: None, or a function of q / k [B, T, H, K] applied before attention and the cache
    (llama's RoPE), so cached keys are stored already rotated by their own positions; qk_gains:
    None, or (q_gain_K, k_gain_K) of model.qk_norm: each head's queries and keys RMS-normalised
    over K and scaled by the gains, before `rotate` and the cache; segment_ids_BT: None, or int32
    document ids of data.document_mask, which restrict attention to each document (an explicit
    mask: cuDNN takes it as an additive bias; the cache never has one)."""
    B, T, D = y_BTD.shape
    H, dtype = cfg.n_head, jnp.dtype(cfg.dtype)
    y_BTD = y_BTD.astype(dtype)  # the stream is float32; the sublayer computes in dtype
    # The fused [q|k|v] columns viewed as [3, H, K]: a tensor shard slices its own heads
    # out of the weight and computes only those, so q, k, v never move between devices.
    qkv_D3HK = constrain(qkv_kernel.reshape(D, 3, H, D // H), ("embed", None, "heads", None))
    qkv_bias_3HK = None if qkv_bias is None else constrain(qkv_bias.reshape(3, H, D // H), (None, "heads", None))
    qkv_BT3HK = token_matmul(y_BTD, qkv_D3HK.astype(dtype))
    if qkv_bias_3HK is not None:
        qkv_BT3HK = qkv_BT3HK + qkv_bias_3HK.astype(dtype)
    qkv_BT3HK = constrain(qkv_BT3HK, ("batch", "seq", None, "heads", None))
    q_BTHK, k_BTHK, v_BTHK = (qkv_BT3HK[:, :, i] for i in range(3))
    if qk_gains is not None:
        q_BTHK, k_BTHK = (rms_norm(x, gain, eps=cfg.ln_eps) for x, gain in zip((q_BTHK, k_BTHK), qk_gains))
    if rotate is not None:
        q_BTHK, k_BTHK = rotate(q_BTHK), rotate(k_BTHK)
    if cache is None:
        mask = None if segment_ids_BT is None else document_mask(segment_ids_BT)
        o_BTHK, kv = jax.nn.dot_product_attention(q_BTHK, k_BTHK, v_BTHK, mask=mask, is_causal=True,
                                                  implementation=attention_impl(cfg)[0]), None
    elif segment_ids_BT is not None:
        raise ValueError("document segment ids are for training's packed rows; the KV cache takes none")
    else:
        o_BTHK, kv = cached_attention(q_BTHK, k_BTHK, v_BTHK, *cache)
    o_BTHK = constrain(o_BTHK, ("batch", "seq", "heads", None))
    out_BTD = token_matmul(o_BTHK.reshape(B, T, D), out_kernel.astype(dtype))
    if out_bias is not None:
        out_BTD = out_BTD + out_bias.astype(dtype)
    out_BTD = constrain(out_BTD, STREAM_BTD)
    return out_BTD, kv


def _gelu_proj(h_BTF, fc_bias, proj_kernel, impl: str):
    a_BTF = constrain(kernels.bias_gelu(h_BTF, fc_bias, impl=impl), ("batch", "seq", "mlp"))
    return token_matmul(a_BTF, proj_kernel.astype(h_BTF.dtype))


# model.remat=gelu: the GELU output (B T 4D, the largest activation a block keeps) is not saved for
# the projection's weight gradient but recomputed from the pre-activation, which GELU's own backward
# keeps anyway: one elementwise pass instead of B T 4D values held per block.
_gelu_proj_recomputed = jax.checkpoint(_gelu_proj, static_argnums=(3,), policy=jax.checkpoint_policies.nothing_saveable)


def mlp(y_BTD, fc_kernel, fc_bias, proj_kernel, proj_bias, cfg: ModelConfig, impl: str):
    """proj(GELU(fc(y))), the bias and GELU fused in one kernel, computed in cfg.dtype."""
    dtype = jnp.dtype(cfg.dtype)
    h_BTF = constrain(token_matmul(y_BTD.astype(dtype), fc_kernel.astype(dtype)), ("batch", "seq", "mlp"))
    gelu_proj = _gelu_proj_recomputed if cfg.remat == "gelu" else _gelu_proj
    return constrain(gelu_proj(h_BTF, fc_bias, proj_kernel, impl) + proj_bias.astype(dtype), STREAM_BTD)
