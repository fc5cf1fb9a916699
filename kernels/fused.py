"""The fused ops as `jax.custom_vjp` functions over a kernel backend (Pallas or Triton).

A backend module supplies four functions on 2-D [rows, D] arrays with the signatures of
`kernels.pallas_ops`: ln_fwd, ln_bwd, bias_gelu_fwd, bias_gelu_bwd. This module flattens any
leading shape into rows, keeps the statistics as residuals, runs each kernel per row shard
(`kernels.sharded`) and gives the cotangents in the dtypes of the primals.

The custom_vjp sits outside the shard_map (forward and backward each run their own shard_map),
so autodiff never has to transpose a shard_map around an opaque kernel.
"""
from __future__ import annotations

import functools
import math

import jax

from kernels import sharded


def _rows(a):
    return a.reshape(math.prod(a.shape[:-1]), a.shape[-1])


@functools.lru_cache(maxsize=None)
def residual_layer_norm_fn(backend, eps: float):
    """(x, delta, alpha_f32, gamma, beta) -> (h, y) with h = x + alpha delta, y = LN(h)."""

    def local_fwd(x, delta, alpha, gamma, beta):
        h, y, mean, rstd = backend.ln_fwd(_rows(x), gamma, beta, eps=eps, delta=_rows(delta),
                                          alpha=alpha)
        return h.reshape(x.shape), y.reshape(x.shape), mean.reshape(x.shape[:-1]), rstd.reshape(x.shape[:-1])

    def fwd(x, delta, alpha, gamma, beta):
        layout = sharded.row_layout(x)
        h, y, mean, rstd = sharded.call(local_fwd, layout, (x, delta, alpha, gamma, beta),
                                        ("row", "row", "rep", "rep", "rep"),
                                        ("row", "row", "stat", "stat"))
        return (h, y), (h, delta, alpha, gamma, beta, mean, rstd)

    def local_bwd(h, dy, dh, delta, alpha, gamma, mean, rstd):
        dx, ddelta, dgamma, dbeta, dalpha = backend.ln_bwd(
            _rows(h), _rows(dy), gamma, mean.reshape(-1), rstd.reshape(-1), dh=_rows(dh),
            delta=_rows(delta), alpha=alpha)
        return dx.reshape(h.shape), ddelta.reshape(h.shape), dgamma, dbeta, dalpha

    def bwd(res, cotangents):
        h, delta, alpha, gamma, beta, mean, rstd = res
        dh, dy = cotangents
        dx, ddelta, dgamma, dbeta, dalpha = sharded.call(
            local_bwd, sharded.row_layout(h), (h, dy, dh, delta, alpha, gamma, mean, rstd),
            ("row", "row", "row", "row", "rep", "rep", "stat", "stat"),
            ("row", "row", "sum", "sum", "sum"))
        return (dx, ddelta.astype(delta.dtype), dalpha.astype(alpha.dtype),
                dgamma.astype(gamma.dtype), dbeta.astype(beta.dtype))

    @jax.custom_vjp
    def op(x, delta, alpha, gamma, beta):
        return fwd(x, delta, alpha, gamma, beta)[0]

    op.defvjp(fwd, bwd)
    return op


@functools.lru_cache(maxsize=None)
def layer_norm_fn(backend, eps: float):
    """(x, gamma, beta) -> LN(x)."""

    def local_fwd(x, gamma, beta):
        _, y, mean, rstd = backend.ln_fwd(_rows(x), gamma, beta, eps=eps)
        return y.reshape(x.shape), mean.reshape(x.shape[:-1]), rstd.reshape(x.shape[:-1])

    def fwd(x, gamma, beta):
        y, mean, rstd = sharded.call(local_fwd, sharded.row_layout(x), (x, gamma, beta),
                                     ("row", "rep", "rep"), ("row", "stat", "stat"))
        return y, (x, gamma, beta, mean, rstd)

    def local_bwd(x, dy, gamma, mean, rstd):
        dx, _, dgamma, dbeta, _ = backend.ln_bwd(_rows(x), _rows(dy), gamma, mean.reshape(-1),
                                                 rstd.reshape(-1))
        return dx.reshape(x.shape), dgamma, dbeta

    def bwd(res, dy):
        x, gamma, beta, mean, rstd = res
        dx, dgamma, dbeta = sharded.call(local_bwd, sharded.row_layout(x), (x, dy, gamma, mean, rstd),
                                         ("row", "row", "rep", "stat", "stat"), ("row", "sum", "sum"))
        return dx, dgamma.astype(gamma.dtype), dbeta.astype(beta.dtype)

    @jax.custom_vjp
    def op(x, gamma, beta):
        return fwd(x, gamma, beta)[0]

    op.defvjp(fwd, bwd)
    return op


@functools.lru_cache(maxsize=None)
def bias_gelu_fn(backend):
    """(h, bias) -> GELU(h + bias)."""

    def local_fwd(h, bias):
        return (backend.bias_gelu_fwd(_rows(h), bias).reshape(h.shape),)

    # Elementwise along the features too: under tensor parallelism h's hidden width stays split.
    def fwd(h, bias):
        (y,) = sharded.call(local_fwd, sharded.row_layout(h, features=True), (h, bias), ("row", "vec"), ("row",))
        return y, (h, bias)

    def local_bwd(h, bias, dy):
        dh, dbias = backend.bias_gelu_bwd(_rows(h), bias, _rows(dy))
        return dh.reshape(h.shape), dbias

    def bwd(res, dy):
        h, bias = res
        dh, dbias = sharded.call(local_bwd, sharded.row_layout(h, features=True), (h, bias, dy),
                                 ("row", "vec", "row"), ("row", "vsum"))
        return dh, dbias.astype(bias.dtype)

    @jax.custom_vjp
    def op(h, bias):
        return fwd(h, bias)[0]

    op.defvjp(fwd, bwd)
    return op
