"""model.family=llama: the official ProRes code's Llama block, in the same placements, inits,
schedules, gates, remat and KV cache as the GPT-2 family (gpt2.py, with the same functions and
tables; transformer.FAMILIES lists them).

    x = tok_embedding[ids]                       # no position table: RoPE rotates q and k
    for l in 1..L:  x = block_l(x)               # e.g. pre: x + a_l Attn(RMS(x)), x + a_l MLP(RMS(x))
    logits = RMS(x) @ lm_head_kernel             # untied head, [D, V]

- RMSNorm: x / sqrt(mean(x^2) + eps) * g, a gain only (no bias), statistics in float32;
- no bias in any linear; attention keeps the fused [q|k|v] kernel of the GPT-2 family;
- SwiGLU: down(silu(gate(y)) * up(y)), hidden width F = model.mlp_ratio x model.d_model (the
  official code's Llama configs use about 8/3 d; neither SPEC.md nor the paper fixes it, and one
  width for both families keeps one `mlp` axis size for the sharding rules);
- RoPE in Hugging Face Llama's rotate_half layout: a head's K dimensions are two halves
  [x1 | x2] and pair i is (x1_i, x2_i), rotated by position * theta^(-2i/K), theta = 10000.
  This is the layout HF's LlamaForCausalLM computes, so the export writes q_proj / k_proj as
  they are; Meta's original checkpoints pair (x_2i, x_2i+1) (interleaved), which HF's
  conversion script permutes and we never need to;
- init: matrices as the GPT-2 family (model.init), the head N(0, init_std), the token
  embedding N(0, init_std * sqrt(d_model)).
Only the xla kernel backend: config validation refuses kernels.impl=pallas / triton for llama.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import flax.linen as nn

from andrea_jax import kernels
from andrea_jax.config import ModelConfig
from andrea_jax.model import layers
from andrea_jax.model.layers import STREAM_BTD, constrain, padded_vocab, rms_norm, token_matmul

ROPE_THETA = 10000.0  # HF LlamaConfig's default rope_theta, as the official code leaves it


# Names of the dimensions of this block's matrices (transformer.Block puts the norms' gains on the
# stream's width); SwiGLU's gate and up split their F columns as the GELU MLP's fc does
BLOCK_PARAM_AXES = {**layers.ATTENTION_PARAM_AXES, "mlp_gate_kernel": ("embed", "mlp"),
                    "mlp_up_kernel": ("embed", "mlp"), "mlp_proj_kernel": ("mlp", "embed")}
MLP_MATRICES = 3  # gate, up and down (train/mfu's FLOPs)


def decays(names: tuple[str, ...]) -> bool:
    """Whether weight decay applies to the parameter at this flax path (train/optim.decay_mask), as
    the official ProRes code's AdamW groups have it: to the linears and the head (every kernel) and
    the final norm's gain, not to the token embedding, the blocks' norm gains or the gates."""
    return names[-1].endswith("kernel") or names == ("lnf_scale",)


def residual_rms_norm(x, delta, alpha, gain, *, eps: float):
    """(h, RMSNorm(h)) with h = x + alpha * delta, added in float32 (kernels.reference's contract)."""
    h = (x.astype(jnp.float32) + jnp.asarray(alpha, jnp.float32) * delta.astype(jnp.float32)).astype(x.dtype)
    return h, rms_norm(h, gain, eps=eps)


def rope_tables(positions_BT, head_dim: int, theta: float = ROPE_THETA):
    """(cos, sin), each [B, T, 1, K] float32: the angle of pair i repeated in both halves."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles_BTk = jnp.asarray(positions_BT, jnp.float32)[..., None] * inv_freq
    angles_BT1K = jnp.concatenate([angles_BTk, angles_BTk], axis=-1)[:, :, None, :]
    return jnp.cos(angles_BT1K), jnp.sin(angles_BT1K)


def apply_rope(x_BTHK, tables):
    """x cos + rotate_half(x) sin, rotate_half([x1 | x2]) = [-x2 | x1]; in float32, out in x's dtype."""
    cos, sin = tables
    x = x_BTHK.astype(jnp.float32)
    x1, x2 = jnp.split(x, 2, axis=-1)
    return (x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin).astype(x_BTHK.dtype)


def swiglu(y_BTD, gate_kernel, up_kernel, down_kernel, cfg: ModelConfig):
    """down(silu(gate(y)) * up(y)) without biases; matmuls in cfg.dtype, the gating in float32."""
    dtype = jnp.dtype(cfg.dtype)
    y_BTD = y_BTD.astype(dtype)
    mlp_BTF = ("batch", "seq", "mlp")
    g_BTF = constrain(token_matmul(y_BTD, gate_kernel.astype(dtype)), mlp_BTF)
    u_BTF = constrain(token_matmul(y_BTD, up_kernel.astype(dtype)), mlp_BTF)
    h_BTF = constrain((jax.nn.silu(g_BTF.astype(jnp.float32)) * u_BTF.astype(jnp.float32)).astype(dtype), mlp_BTF)
    return constrain(token_matmul(h_BTF, down_kernel.astype(dtype)), STREAM_BTD)


def check_impl(impl: str) -> None:
    """The model-level guard behind config validation (a caller may build Andrea directly)."""
    if kernels.resolve(impl) != "xla":
        raise ValueError(f"kernels.impl={impl} has no RMSNorm or SwiGLU kernels for model.family=llama; use xla")


def block_sublayers(matrix, vector, cfg: ModelConfig, norm_names, impl: str, cache, rope, segment_ids_BT=None):
    """Creates one llama block's parameters through the Block's `matrix` / `vector` factories and
    returns its (attend, mlp, norm, residual_norm), as gpt2.block_sublayers does (impl is always
    xla here: `spine` checks it). The names
    follow the GPT-2 family's where the role is the same (the down projection is mlp_proj_kernel,
    so the output-projection inits scaled / ds / deepnorm treat it alike)."""
    D, F = cfg.d_model, cfg.mlp_ratio * cfg.d_model
    ones = nn.initializers.ones
    gains = {"ln1": vector("ln1_scale", ones, D)}
    qkv_kernel, out_kernel = matrix("attn_qkv_kernel", (D, 3 * D)), matrix("attn_out_kernel", (D, D))
    gains["ln2"] = vector("ln2_scale", ones, D)
    gate_kernel, up_kernel = matrix("mlp_gate_kernel", (D, F)), matrix("mlp_up_kernel", (D, F))
    down_kernel = matrix("mlp_proj_kernel", (F, D))
    gains |= {name: vector(f"{name}_scale", ones, D) for name in norm_names[2:]}
    qk_gains = layers.qk_norm_gains(vector, cfg)

    def attend(y_BTD):
        return layers.attention(y_BTD, qkv_kernel, None, out_kernel, None, cfg, cache,
                                rotate=lambda x_BTHK: apply_rope(x_BTHK, rope), qk_gains=qk_gains,
                                segment_ids_BT=segment_ids_BT)

    def mlp(y_BTD):
        return swiglu(y_BTD, gate_kernel, up_kernel, down_kernel, cfg)

    def norm(name, x, y_dtype=None):
        y = rms_norm(x, gains[name], eps=cfg.ln_eps)
        return y if y_dtype is None else y.astype(y_dtype)

    def residual_norm(name, x, f, a, y_dtype=None):
        x, y = residual_rms_norm(x, f, a, gains[name], eps=cfg.ln_eps)
        return x, (y if y_dtype is None else y.astype(y_dtype))

    return attend, mlp, norm, residual_norm


def spine(param, cfg: ModelConfig, tokens_BT, cache, impl: str, positions_BT=None):
    """The ends of the llama model: (x_BTD, rope tables, head) where head(x_BTD) is the operands
    of the logits (y_BTD, w_DP), the final RMSNorm and the untied head over the padded vocabulary,
    both in the compute dtype. Positions are positions_BT when given (model.reset_positions), else
    the cache's (left-padded rows differ), else 0..T-1. Refuses an impl other than xla."""
    check_impl(impl)
    named = nn.with_logical_partitioning
    D, V = cfg.d_model, cfg.vocab_size
    tok_embedding_VD = param("tok_embedding", named(nn.initializers.normal(cfg.init_std * math.sqrt(D)),
                                                    ("vocab", "embed")), (V, D), jnp.float32)
    lnf_scale = param("lnf_scale", named(nn.initializers.ones, ("act_embed",)), (D,), jnp.float32)
    head_DV = param("lm_head_kernel", named(nn.initializers.normal(cfg.init_std), ("embed", "vocab")),
                    (D, V), jnp.float32)
    T = tokens_BT.shape[1]
    if positions_BT is None:
        positions_BT = jnp.arange(T, dtype=jnp.int32)[None] if cache is None else cache.positions_BT
    rope = rope_tables(positions_BT, D // cfg.n_head)
    table_VD = constrain(tok_embedding_VD, ("vocab", None))  # whole rows, as the GPT-2 lookup
    x_BTD = constrain(table_VD[tokens_BT].astype(jnp.float32), STREAM_BTD)

    def head(x_BTD):
        dtype = jnp.dtype(cfg.dtype)
        y_BTD = rms_norm(x_BTD, lnf_scale, eps=cfg.ln_eps)
        padded_DP = jnp.pad(head_DV, ((0, 0), (0, padded_vocab(V) - V)))  # zero columns
        return y_BTD.astype(dtype), padded_DP.astype(dtype)

    return x_BTD, rope, head


# Hugging Face's LlamaForCausalLM, read and written by model/hf.py through these tables.
HF_ARCHITECTURE, NORM = "Llama", "RMSNorm"  # for messages: the architecture and the norm its blocks apply
HF_NAMES = {"tok_embedding": "model.embed_tokens.weight", "lnf_scale": "model.norm.weight",
            "lm_head_kernel": "lm_head.weight"}
HF_BLOCK = "model.layers."  # block i's names follow HF_BLOCK + f"{i}."
# Our fused attn_qkv_kernel is [q | k | v], the columns of the three projections.
HF_BLOCK_NAMES = {
    "ln1_scale": "input_layernorm.weight",
    "attn_qkv_kernel": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "attn_out_kernel": "self_attn.o_proj.weight",
    "ln2_scale": "post_attention_layernorm.weight", "mlp_gate_kernel": "mlp.gate_proj.weight",
    "mlp_up_kernel": "mlp.up_proj.weight", "mlp_proj_kernel": "mlp.down_proj.weight"}
HF_TRANSPOSED = True  # every Linear is torch's [out, in], the transpose of our kernel; the norms' gains are not
HF_TIED = {}  # the head is untied
HF_BUFFERS = ("self_attn.rotary_emb.inv_freq",)  # in the blocks of old checkpoints: not weights
HF_FOLD_NOTE = ("ProRes alphas (and learned gates) are folded into o_proj and down_proj; lns's 1/sqrt(l) into "
                "the two RMSNorm gains")


def hf_config(m: ModelConfig) -> dict:
    """transformers' LlamaConfig of the model of `m` (the architecture; hf.config_json adds the rest)."""
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "vocab_size": m.vocab_size, "hidden_size": m.d_model, "intermediate_size": m.mlp_ratio * m.d_model,
        "num_hidden_layers": m.n_layer, "num_attention_heads": m.n_head, "num_key_value_heads": m.n_head,
        "head_dim": m.d_model // m.n_head, "hidden_act": "silu", "max_position_embeddings": m.seq_len,
        "rms_norm_eps": m.ln_eps, "initializer_range": m.init_std,
        # v5 reads rope_parameters, v4 rope_theta
        "rope_theta": ROPE_THETA, "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "pretraining_tp": 1,
        "tie_word_embeddings": False,
    }


def hf_checked(m: ModelConfig) -> dict[str, str]:
    """The entries of hf_config that a folder read by train.init_from must match where it has
    them, each with what our model computes there."""
    return {"num_key_value_heads": f"model.n_head={m.n_head} key-value heads",
            "rms_norm_eps": f"model.ln_eps={m.ln_eps}", "rope_theta": f"RoPE theta {ROPE_THETA:g}",
            "hidden_act": "SwiGLU (silu)", "attention_bias": "none", "mlp_bias": "none",
            "tie_word_embeddings": "none"}
