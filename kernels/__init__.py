"""Fused ops for transformer blocks, with one dispatch point that picks the backend.

Stands alone: usable by any JAX model, imports nothing of andrea_jax.
Backends (`impl`): `xla` (the jnp reference in `reference.py`), `auto` (the best available).
"""
from __future__ import annotations

import jax

from kernels import reference

IMPLS = ("auto", "xla")


def _resolve(impl: str) -> str:
    if impl not in IMPLS:
        raise ValueError(f"unknown kernel impl {impl!r}; known: {', '.join(IMPLS)}")
    if impl == "auto":
        return "xla"
    return impl


def layer_norm(x, gamma, beta, *, eps: float = 1e-5, impl: str = "auto"):
    _resolve(impl)
    return reference.layer_norm(x, gamma, beta, eps=eps)


def residual_layer_norm(x, delta, alpha, gamma, beta, *, eps: float = 1e-5, impl: str = "auto"):
    """(h, y) with h = x + alpha * delta and y = LayerNorm(h)."""
    _resolve(impl)
    return reference.residual_layer_norm(x, delta, alpha, gamma, beta, eps=eps)


def bias_gelu(h, bias, *, impl: str = "auto"):
    _resolve(impl)
    return reference.bias_gelu(h, bias)
