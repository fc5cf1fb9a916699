"""Model FLOPs utilisation: the FLOPs the model's shape needs per trained token, over the chip's peak.

Per token, forward + backward = 3 x forward, and a matmul of a [D_in, D_out] weight costs
2 D_in D_out FLOPs forward, so:

    6 x (matmul weights per token: L (4 D^2 + 2 D F) for qkv, out, MLP in and out, + V D for the
         tied logits projection over the real vocabulary)
  + 6 L D (T + 1) for causal attention: Q K^T and A V cost 2 D each per (query, key) pair,
    x 3 for the backward, and a query at position t sees t + 1 keys: (T + 1) / 2 on average.

Counted once, causal half only: what the model needs, not what a kernel happens to compute (no
masked-out scores, no vocabulary padding, no recomputation under model.remat, no LayerNorm,
GELU or softmax). The peak is the dense bf16 rate of one chip (no 2:4 sparsity). The family says
how many MLP matrices it has (MLP_MATRICES: llama's SwiGLU three, gate, up, down); llama's untied
head counts as the tied one (the embedding lookup is no matmul).

Every training run's metric lines carry `mfu` from these (train.peak_tflops, or the device kind's
peak); benchmarks/train_step.py reports it too.
"""
from __future__ import annotations

PEAK_FLOPS = {  # dense bf16 FLOP/s per chip, matched as a substring of jax's device_kind
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
}


def train_flops_per_token(d_model: int, n_layer: int, mlp_dim: int, vocab_size: int, seq_len: int,
                          mlp_matrices: int = 2) -> float:
    D, L, F, V, T = d_model, n_layer, mlp_dim, vocab_size, seq_len
    matmul_weights = L * (4 * D * D + mlp_matrices * D * F) + V * D
    return 6.0 * matmul_weights + 6.0 * L * D * (T + 1)


def model_flops_per_token(model_cfg, seq_len: int | None = None) -> float:
    """train_flops_per_token of an andrea_jax.config.ModelConfig."""
    from andrea_jax.model.transformer import FAMILIES  # here: importing mfu (the ladder) loads no model

    m = model_cfg
    return train_flops_per_token(m.d_model, m.n_layer, m.mlp_ratio * m.d_model, m.vocab_size, seq_len or m.seq_len,
                                 mlp_matrices=FAMILIES[m.family].MLP_MATRICES)


def peak_flops(device_kind: str) -> float | None:
    """Dense bf16 FLOP/s of one chip of this kind; None where unknown (a CPU)."""
    return next((peak for name, peak in PEAK_FLOPS.items() if name.lower() in device_kind.lower()), None)


def mfu(tokens_per_s: float, flops_per_token: float, peak_per_chip: float | None, n_chips: int = 1) -> float | None:
    """The fraction of the chips' peak the model's FLOPs use; None without a peak."""
    if not peak_per_chip:
        return None
    return tokens_per_s * flops_per_token / (peak_per_chip * n_chips)
