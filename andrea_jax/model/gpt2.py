"""model.family=gpt2: the GPT-2 block's layers and the model's ends, composed by transformer.py in
every placement, and the facts of the family that the generic code asks for (transformer.FAMILIES
lists them; llama.py is the other family, with the same names).

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


# Names of the dimensions of this block's matrices and vectors (transformer.Block puts its norms'
# gains and biases on the stream's width)
BLOCK_PARAM_AXES = {**layers.ATTENTION_PARAM_AXES, **layers.MLP_PARAM_AXES}
MLP_MATRICES = 2  # fc and proj, each D x F (train/mfu's FLOPs)


def decays(names: tuple[str, ...]) -> bool:
    """Whether weight decay applies to the parameter at this flax path (train/optim.decay_mask):
    to matrices only, kernels and embeddings, never to biases, norm gains or the residual gates."""
    return names[-1].endswith(("kernel", "embedding"))


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


# Hugging Face's GPT2LMHeadModel, read and written by model/hf.py through these tables.
HF_ARCHITECTURE, NORM = "GPT-2", "LN"  # for messages: the architecture and the norm its blocks apply
HF_NAMES = {"tok_embedding": "transformer.wte.weight", "pos_embedding": "transformer.wpe.weight",
            "lnf_scale": "transformer.ln_f.weight", "lnf_bias": "transformer.ln_f.bias"}
HF_BLOCK = "transformer.h."  # block i's names follow HF_BLOCK + f"{i}."
HF_BLOCK_NAMES = {
    "ln1_scale": "ln_1.weight", "ln1_bias": "ln_1.bias", "attn_qkv_kernel": "attn.c_attn.weight",
    "attn_qkv_bias": "attn.c_attn.bias", "attn_out_kernel": "attn.c_proj.weight", "attn_out_bias": "attn.c_proj.bias",
    "ln2_scale": "ln_2.weight", "ln2_bias": "ln_2.bias", "mlp_fc_kernel": "mlp.c_fc.weight",
    "mlp_fc_bias": "mlp.c_fc.bias", "mlp_proj_kernel": "mlp.c_proj.weight", "mlp_proj_bias": "mlp.c_proj.bias"}
HF_TRANSPOSED = False  # Conv1D weights are [in, out], our kernels' layout
HF_TIED = {"lm_head.weight": "tok_embedding"}  # the head, if a folder holds it, is the token embedding
HF_BUFFERS = ("attn.bias", "attn.masked_bias")  # in the blocks of old checkpoints: not weights
HF_FOLD_NOTE = "ProRes alphas (and learned gates) are folded into c_proj; lns's 1/sqrt(l) into ln_1, ln_2"


def hf_config(m: ModelConfig) -> dict:
    """transformers' GPT2Config of the model of `m` (the architecture; hf.config_json adds the rest)."""
    return {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        "vocab_size": m.vocab_size, "n_positions": m.seq_len, "n_embd": m.d_model, "n_layer": m.n_layer,
        "n_head": m.n_head, "n_inner": m.mlp_ratio * m.d_model,
        "activation_function": "gelu_new",  # tanh GELU, as kernels.bias_gelu
        "layer_norm_epsilon": m.ln_eps, "initializer_range": m.init_std,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
    }


def hf_checked(m: ModelConfig) -> dict[str, str]:
    """The entries of hf_config that a folder read by train.init_from must match where it has
    them, each with what our model computes there."""
    return {"activation_function": "tanh GELU (gelu_new)", "layer_norm_epsilon": f"model.ln_eps={m.ln_eps}",
            "scale_attn_by_inverse_layer_idx": "attention scaled by 1/sqrt(K) only"}
