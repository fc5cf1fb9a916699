"""The fused ops as `jax.custom_vjp` functions over a kernel backend (Pallas or Triton).

A backend module supplies four functions on 2-D [rows, D] arrays with the signatures of
`kernels.pallas_ops`: ln_fwd, ln_bwd, bias_gelu_fwd, bias_gelu_bwd. This module flattens any
leading shape into rows, keeps the statistics as residuals, runs each kernel per row shard
(`kernels.sharded`) and gives the cotangents in the dtypes of the primals.

The custom_vjp sits outside the shard_map (forward and backward each run their own shard_map),
so autodiff never has to transpose a shard_map around an opaque kernel.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from andrea_jax.errors import KernelUnavailableError
from andrea_jax.kernels import sharded


def _rows(a, backend):
    """a as the [rows, D] the kernels take; refuses an array past the backend's MAX_ELEMENTS (the
    Pallas kernels compute element offsets row * D + column in int32)."""
    if a.size > getattr(backend, "MAX_ELEMENTS", a.size):
        raise KernelUnavailableError(
            f"a fused kernel would address {math.prod(a.shape[:-1])} rows x {a.shape[-1]} = {a.size} elements "
            f"on one device, past the int32 offsets it computes (2^31); split the rows over more devices "
            f"(mesh.data / mesh.fsdp), raise train.microbatches, or use kernels.impl=xla")
    return a.reshape(math.prod(a.shape[:-1]), a.shape[-1])


@dataclasses.dataclass(frozen=True)
class _Dtypes:
    """Static residual: the dtypes the backward casts its cotangents to (no array is saved)."""
    dtypes: tuple


jax.tree_util.register_static(_Dtypes)


def _instantiate(ct):
    """A cotangent that `symbolic_zeros` passes as a SymbolicZero, as a zero array."""
    if isinstance(ct, SymbolicZero):
        return jnp.zeros(ct.shape, ct.dtype)
    return ct


@functools.lru_cache(maxsize=None)
def residual_layer_norm_fn(backend, eps: float, y_dtype: str | None = None):
    """(x, delta, alpha_f32, gamma, beta) -> (h, y) with h = x + alpha delta, y = LN(h) in y_dtype
    (default x's; its cotangent comes back in y_dtype and the kernel reads it as float32).

    With `symbolic_zeros`, the forward rule sees whether alpha is differentiated: alpha is
    usually a constant (the ProRes schedule), and then the backward neither computes dalpha nor
    needs delta, so delta is not saved for it. When alpha is perturbed (e.g. a trained gate
    times the schedule), delta is saved and the kernel reduces dalpha as well.
    """

    def local_fwd(x, delta, alpha, gamma, beta):
        h, y, mean, rstd = backend.ln_fwd(_rows(x, backend), gamma, beta, eps=eps, delta=_rows(delta, backend),
                                          alpha=alpha, y_dtype=y_dtype)
        return h.reshape(x.shape), y.reshape(x.shape), mean.reshape(x.shape[:-1]), rstd.reshape(x.shape[:-1])

    def primal(x, delta, alpha, gamma, beta):
        layout = sharded.row_layout(x)
        h, y, mean, rstd = sharded.call(local_fwd, layout, (x, delta, alpha, gamma, beta),
                                        ("row", "row", "rep", "rep", "rep"),
                                        ("row", "row", "stat", "stat"))
        return h, y, mean, rstd

    def fwd(x, delta, alpha, gamma, beta):
        with_dalpha = alpha.perturbed
        x, delta, alpha, gamma, beta = (p.value for p in (x, delta, alpha, gamma, beta))
        h, y, mean, rstd = primal(x, delta, alpha, gamma, beta)
        dtypes = _Dtypes((delta.dtype, alpha.dtype, gamma.dtype, beta.dtype))
        return (h, y), (h, delta if with_dalpha else None, alpha, gamma, mean, rstd, dtypes)

    def local_bwd(h, dy, dh, alpha, gamma, mean, rstd, *delta):
        dx, ddelta, dgamma, dbeta, dalpha = backend.ln_bwd(
            _rows(h, backend), _rows(dy, backend), gamma, mean.reshape(-1), rstd.reshape(-1), dh=_rows(dh, backend),
            alpha=alpha, delta=_rows(delta[0], backend) if delta else None)
        outs = (dx.reshape(h.shape), ddelta.reshape(h.shape), dgamma, dbeta)
        return outs + ((dalpha,) if delta else ())

    def bwd(res, cotangents):
        h, delta, alpha, gamma, mean, rstd, dtypes = res
        delta_dtype, alpha_dtype, gamma_dtype, beta_dtype = dtypes.dtypes
        dh, dy = (_instantiate(c) for c in cotangents)
        with_dalpha = delta is not None
        outs = sharded.call(
            local_bwd, sharded.row_layout(h),
            (h, dy, dh, alpha, gamma, mean, rstd) + ((delta,) if with_dalpha else ()),
            ("row", "row", "row", "rep", "rep", "stat", "stat") + (("row",) if with_dalpha else ()),
            ("row", "row", "sum", "sum") + (("sum",) if with_dalpha else ()))
        dx, ddelta, dgamma, dbeta = outs[:4]
        # alpha not perturbed: its cotangent is discarded, so a symbolic zero (None) suffices.
        dalpha = outs[4].astype(alpha_dtype) if with_dalpha else None
        return (dx, ddelta.astype(delta_dtype), dalpha, dgamma.astype(gamma_dtype),
                dbeta.astype(beta_dtype))

    @jax.custom_vjp
    def op(x, delta, alpha, gamma, beta):
        h, y, _, _ = primal(x, delta, alpha, gamma, beta)
        return h, y

    op.defvjp(fwd, bwd, symbolic_zeros=True)
    return op


@functools.lru_cache(maxsize=None)
def layer_norm_fn(backend, eps: float, y_dtype: str | None = None):
    """(x, gamma, beta) -> LN(x) in y_dtype (default x's)."""

    def local_fwd(x, gamma, beta):
        _, y, mean, rstd = backend.ln_fwd(_rows(x, backend), gamma, beta, eps=eps, y_dtype=y_dtype)
        return y.reshape(x.shape), mean.reshape(x.shape[:-1]), rstd.reshape(x.shape[:-1])

    def fwd(x, gamma, beta):
        y, mean, rstd = sharded.call(local_fwd, sharded.row_layout(x), (x, gamma, beta),
                                     ("row", "rep", "rep"), ("row", "stat", "stat"))
        # beta is not needed by the backward, only its dtype (static).
        return y, (x, gamma, mean, rstd, _Dtypes((beta.dtype,)))

    def local_bwd(x, dy, gamma, mean, rstd):
        dx, _, dgamma, dbeta, _ = backend.ln_bwd(_rows(x, backend), _rows(dy, backend), gamma, mean.reshape(-1),
                                                 rstd.reshape(-1))
        return dx.reshape(x.shape), dgamma, dbeta

    def bwd(res, dy):
        x, gamma, mean, rstd, dtypes = res
        (beta_dtype,) = dtypes.dtypes
        dx, dgamma, dbeta = sharded.call(local_bwd, sharded.row_layout(x), (x, dy, gamma, mean, rstd),
                                         ("row", "row", "rep", "stat", "stat"), ("row", "sum", "sum"))
        return dx, dgamma.astype(gamma.dtype), dbeta.astype(beta_dtype)

    @jax.custom_vjp
    def op(x, gamma, beta):
        return fwd(x, gamma, beta)[0]

    op.defvjp(fwd, bwd)
    return op


@functools.lru_cache(maxsize=None)
def bias_gelu_fn(backend):
    """(h, bias) -> GELU(h + bias)."""

    def local_fwd(h, bias):
        return (backend.bias_gelu_fwd(_rows(h, backend), bias).reshape(h.shape),)

    # Elementwise along the features too: under tensor parallelism h's hidden width stays split.
    def fwd(h, bias):
        (y,) = sharded.call(local_fwd, sharded.row_layout(h, features=True), (h, bias), ("row", "vec"), ("row",))
        return y, (h, bias)

    def local_bwd(h, bias, dy):
        dh, dbias = backend.bias_gelu_bwd(_rows(h, backend), bias, _rows(dy, backend))
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
