"""jnp references of the fused ops: the `xla` backend and the ground truth of every kernel test.

Statistics and reductions run in float32 whatever the input dtype; outputs are in the input dtype,
but a LayerNorm's `y_dtype` (the dtype of the matmul its output feeds).
"""
from __future__ import annotations

import math

import jax.numpy as jnp

_GELU_C = math.sqrt(2.0 / math.pi)


def layer_norm(x, gamma, beta, *, eps: float = 1e-5, y_dtype=None):
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    y = (x32 - mean) * jnp.reciprocal(jnp.sqrt(var + eps))
    return (y * gamma.astype(jnp.float32) + beta.astype(jnp.float32)).astype(y_dtype or x.dtype)


def residual_layer_norm(x, delta, alpha, gamma, beta, *, eps: float = 1e-5, y_dtype=None):
    """h = x + alpha * delta; y = LayerNorm(h) (in y_dtype, default x's). Returns (h, y)."""
    h = (x.astype(jnp.float32) + jnp.asarray(alpha, jnp.float32) * delta.astype(jnp.float32)).astype(x.dtype)
    return h, layer_norm(h, gamma, beta, eps=eps, y_dtype=y_dtype)


def gelu_tanh(u):
    return 0.5 * u * (1.0 + jnp.tanh(_GELU_C * (u + 0.044715 * u * u * u)))


def bias_gelu(h, bias):
    """tanh GELU of h + bias (the ANDREA document's formula), computed in float32."""
    u = h.astype(jnp.float32) + bias.astype(jnp.float32)
    return gelu_tanh(u).astype(h.dtype)
