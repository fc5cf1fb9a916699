"""Pallas kernels of the fused ops on 2-D [rows, D] arrays (forward and backward, no autodiff here).

One source for both targets: on GPU the kernels lower through Triton; on CPU they run with
`interpret=True`. Triton tensors must have power-of-two shapes, so a program covers a
[rows_per_block, next_pow2(D)] tile and masks the rows and columns that fall outside the array
(masked loads read 0, masked stores write nothing). Refs are whole arrays indexed with explicit
row/column vectors, the pattern Pallas-Triton lowers to plain pointer arithmetic.

Statistics (mean, rstd) and every reduction run in float32. Reductions over rows (dgamma, dbeta,
dalpha, dbias) are written as one partial row per program and summed by the caller, so the result
is deterministic (no atomics).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from andrea_jax.kernels import platform

_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_K = 0.044715


@dataclasses.dataclass
class GpuTiling:
    """Launch shapes on GPU; `benchmarks/kernels_gpu.py` may sweep them (set before tracing)."""
    tile_elems: int = 4096      # elements per row-wise tile (rows x next_pow2(D)) of the norms' forward
    norm_warps: int = 4
    # The norms' backward holds several tile-sized float32 values per thread (xhat, dy, g, dx, ...).
    # ptxas on sm_90a (benchmarks/kernel_registers.py, D = 768, bf16 dy): at 4096 elements over 4
    # warps 166 / 201 / 216 registers (layer_norm / residual / with dalpha), 3 / 2 / 2 CTAs an SM;
    # at 1024 (one row of 768 a tile, the program loops over its rows) 64 / 64 / 80, 8 / 8 / 6 CTAs.
    # Same programs, same bytes moved; its speed on the GPU is pending (gpu_all.sh's kernel phase).
    bwd_tile_elems: int = 1024
    bwd_warps: int = 4
    gelu_rows: int = 8          # GELU tile: gelu_rows x gelu_cols
    gelu_cols: int = 1024
    gelu_warps: int = 4
    target_programs: int = 528  # backward programs (4 per SM on an H200) writing partial sums
    min_rows_per_program: int = 32  # backward: keeps the partial sums a few % of the traffic
    bwd_stages: int = 1         # Triton software pipelining of the backward's row loop


GPU_TILING = GpuTiling()
# Refs are indexed with int32 row * D + column offsets: one call may hold fewer elements than this
# (kernels.fused refuses a larger one with one line; the Triton kernels compute int64 offsets).
MAX_ELEMENTS = 2**31 - 1
# In interpret mode every grid step is a loop iteration of gathers and scatters, so big tiles are
# fast; 2 sub-blocks per backward program keep the in-kernel accumulation loop exercised on CPU.
_CPU_TILE_ELEMS = 1 << 17
_CPU_SUB_BLOCKS = 2


# None: interpret exactly when the target backend (kernels.target_backend) is not a GPU. False
# forces the Triton lowering, e.g. to export for CUDA from a machine without one (tests/test_kernels.py does).
INTERPRET: bool | None = None


def _interpret() -> bool:
    if INTERPRET is not None:
        return INTERPRET
    return platform.target_backend() != "gpu"


def _params(num_warps: int, num_stages: int = 1):
    if _interpret():
        return {}
    return {"compiler_params": plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)}


def _sub_blocks(n_tiles: int, block_rows: int) -> int:
    """Row tiles per backward program: enough programs to fill the GPU, few enough partials."""
    if _interpret():
        return _CPU_SUB_BLOCKS
    return max(pl.cdiv(n_tiles, GPU_TILING.target_programs),
               pl.cdiv(GPU_TILING.min_rows_per_program, block_rows))


@dataclasses.dataclass(frozen=True)
class _Rows:
    """Row tiling: `block` rows per tile, `n_sub` tiles per program, `programs` programs."""
    block: int
    n_sub: int
    programs: int


def _row_tiling(n_rows: int, cols_p2: int, *, accumulate: bool) -> _Rows:
    elems = _CPU_TILE_ELEMS if _interpret() else GPU_TILING.bwd_tile_elems if accumulate else GPU_TILING.tile_elems
    block = max(1, min(elems // cols_p2, pl.next_power_of_2(n_rows)))
    n_blocks = pl.cdiv(n_rows, block)
    n_sub = _sub_blocks(n_blocks, block) if accumulate else 1
    n_sub = min(n_sub, n_blocks)
    return _Rows(block, n_sub, pl.cdiv(n_blocks, n_sub))


def _load(ref, rows, cols, mask):
    return plgpu.load(ref.at[rows[:, None], cols[None, :]], mask=mask, other=0).astype(jnp.float32)


def _store(ref, rows, cols, mask, value):
    plgpu.store(ref.at[rows[:, None], cols[None, :]], value.astype(ref.dtype), mask=mask)


def _store_partial(ref, pid, cols, n_cols, value):
    """Writes this program's partial column sums into row `pid` of a flat [programs * n_cols]."""
    plgpu.store(ref.at[pid * n_cols + cols], value, mask=cols < n_cols)


# ----------------------------------------------------------------------------- LayerNorm


def _ln_fwd_kernel(*refs, n_rows, n_cols, cols_p2, block, eps, residual):
    if residual:
        x_ref, delta_ref, alpha_ref, gamma_ref, beta_ref, h_ref, y_ref, mean_ref, rstd_ref = refs
    else:
        x_ref, gamma_ref, beta_ref, y_ref, mean_ref, rstd_ref = refs
    rows = pl.program_id(0) * block + jnp.arange(block)
    cols = jnp.arange(cols_p2)
    row_ok, col_ok = rows < n_rows, cols < n_cols
    mask = row_ok[:, None] & col_ok[None, :]
    h = _load(x_ref, rows, cols, mask)
    if residual:
        h = h + alpha_ref[...] * _load(delta_ref, rows, cols, mask)
        # The stream is stored in the input dtype; normalise exactly what was stored.
        h = h.astype(h_ref.dtype)
        _store(h_ref, rows, cols, mask, h)
        h = h.astype(jnp.float32)
    mean = jnp.sum(h, axis=1) / n_cols
    centred = jnp.where(mask, h - mean[:, None], 0.0)
    rstd = 1.0 / jnp.sqrt(jnp.sum(centred * centred, axis=1) / n_cols + eps)
    gamma = plgpu.load(gamma_ref.at[cols], mask=col_ok, other=0).astype(jnp.float32)
    beta = plgpu.load(beta_ref.at[cols], mask=col_ok, other=0).astype(jnp.float32)
    _store(y_ref, rows, cols, mask, centred * rstd[:, None] * gamma[None, :] + beta[None, :])
    plgpu.store(mean_ref.at[rows], mean, mask=row_ok)
    plgpu.store(rstd_ref.at[rows], rstd, mask=row_ok)


def ln_fwd(x, gamma, beta, *, eps, delta=None, alpha=None, y_dtype=None):
    """x, delta: [R, D]; alpha: f32 scalar. Returns (h or None, y, mean[R], rstd[R]); y in y_dtype
    (default x's): the float32 stream's LayerNorm written straight in the bf16 its matmul reads."""
    n_rows, n_cols = x.shape
    cols_p2 = pl.next_power_of_2(n_cols)
    tiling = _row_tiling(n_rows, cols_p2, accumulate=False)
    residual = delta is not None
    row_out = jax.ShapeDtypeStruct((n_rows, n_cols), x.dtype)
    y_out = jax.ShapeDtypeStruct((n_rows, n_cols), y_dtype or x.dtype)
    stat_out = jax.ShapeDtypeStruct((n_rows,), jnp.float32)
    out_shape = ([row_out] if residual else []) + [y_out, stat_out, stat_out]
    kernel = functools.partial(_ln_fwd_kernel, n_rows=n_rows, n_cols=n_cols, cols_p2=cols_p2,
                               block=tiling.block, eps=eps, residual=residual)
    call = pl.pallas_call(kernel, out_shape=out_shape, grid=(tiling.programs,),
                          interpret=_interpret(), name="residual_layer_norm_fwd" if residual else
                          "layer_norm_fwd", **_params(GPU_TILING.norm_warps))
    if residual:
        h, y, mean, rstd = call(x, delta, jnp.asarray(alpha, jnp.float32), gamma, beta)
        return h, y, mean, rstd
    y, mean, rstd = call(x, gamma, beta)
    return None, y, mean, rstd


def _ln_bwd_kernel(*refs, n_rows, n_cols, cols_p2, block, n_sub, residual, with_dalpha):
    if with_dalpha:
        (h_ref, dy_ref, gamma_ref, mean_ref, rstd_ref, dh_ref, alpha_ref, delta_ref,
         dx_ref, ddelta_ref, dgamma_ref, dbeta_ref, dalpha_ref) = refs
    elif residual:
        (h_ref, dy_ref, gamma_ref, mean_ref, rstd_ref, dh_ref, alpha_ref,
         dx_ref, ddelta_ref, dgamma_ref, dbeta_ref) = refs
    else:
        h_ref, dy_ref, gamma_ref, mean_ref, rstd_ref, dx_ref, dgamma_ref, dbeta_ref = refs
    pid = pl.program_id(0)
    cols = jnp.arange(cols_p2)
    col_ok = cols < n_cols
    gamma = plgpu.load(gamma_ref.at[cols], mask=col_ok, other=0).astype(jnp.float32)
    alpha = alpha_ref[...] if residual else None

    def body(i, acc):
        dgamma, dbeta, dalpha = acc
        rows = (pid * n_sub + i) * block + jnp.arange(block)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & col_ok[None, :]
        mean = plgpu.load(mean_ref.at[rows], mask=row_ok, other=0)
        rstd = plgpu.load(rstd_ref.at[rows], mask=row_ok, other=0)
        xhat = jnp.where(mask, (_load(h_ref, rows, cols, mask) - mean[:, None]) * rstd[:, None], 0.0)
        dy = _load(dy_ref, rows, cols, mask)
        g = dy * gamma[None, :]
        c_xhat = jnp.sum(g * xhat, axis=1) / n_cols
        c_one = jnp.sum(g, axis=1) / n_cols
        dx = (g - c_one[:, None] - xhat * c_xhat[:, None]) * rstd[:, None]
        if residual:
            dx = dx + _load(dh_ref, rows, cols, mask)
            _store(ddelta_ref, rows, cols, mask, alpha * dx)
        if with_dalpha:
            dalpha = dalpha + jnp.sum(dx * _load(delta_ref, rows, cols, mask), axis=0)
        _store(dx_ref, rows, cols, mask, dx)
        return dgamma + jnp.sum(dy * xhat, axis=0), dbeta + jnp.sum(dy, axis=0), dalpha

    zeros = jnp.zeros((cols_p2,), jnp.float32)
    dgamma, dbeta, dalpha = lax.fori_loop(0, n_sub, body, (zeros, zeros, zeros))
    _store_partial(dgamma_ref, pid, cols, n_cols, dgamma)
    _store_partial(dbeta_ref, pid, cols, n_cols, dbeta)
    if with_dalpha:
        _store_partial(dalpha_ref, pid, cols, n_cols, dalpha)


def ln_bwd(h, dy, gamma, mean, rstd, *, dh=None, alpha=None, delta=None):
    """Cotangents of ln_fwd. h: the normalised input [R, D] (x, or the stream for the residual form).

    The residual form (dh and alpha given) also returns ddelta = alpha dx; dalpha = sum(dx delta)
    only when `delta` is given too (a static choice: without it the kernel neither reads delta nor
    reduces dalpha, the usual case of a constant alpha).
    Returns (dx, ddelta or None, dgamma[D], dbeta[D], dalpha or None), sums in float32 over the
    local rows only (the sharded wrapper adds them across devices).
    """
    n_rows, n_cols = h.shape
    cols_p2 = pl.next_power_of_2(n_cols)
    tiling = _row_tiling(n_rows, cols_p2, accumulate=True)
    residual = dh is not None
    with_dalpha = delta is not None
    if with_dalpha and not residual:
        raise ValueError("ln_bwd: dalpha (delta given) needs the residual form (dh and alpha)")
    row_out = jax.ShapeDtypeStruct((n_rows, n_cols), h.dtype)
    part_out = jax.ShapeDtypeStruct((tiling.programs * n_cols,), jnp.float32)
    out_shape = [row_out] + ([row_out] if residual else [])
    out_shape += [part_out, part_out] + ([part_out] if with_dalpha else [])
    kernel = functools.partial(_ln_bwd_kernel, n_rows=n_rows, n_cols=n_cols, cols_p2=cols_p2,
                               block=tiling.block, n_sub=tiling.n_sub, residual=residual,
                               with_dalpha=with_dalpha)
    call = pl.pallas_call(kernel, out_shape=out_shape, grid=(tiling.programs,),
                          interpret=_interpret(), name="residual_layer_norm_bwd" if residual else
                          "layer_norm_bwd", **_params(GPU_TILING.bwd_warps, GPU_TILING.bwd_stages))
    col_sum = lambda part: part.reshape(tiling.programs, n_cols).sum(0)
    if with_dalpha:
        dx, ddelta, dgamma, dbeta, dalpha = call(h, dy, gamma, mean, rstd, dh,
                                                 jnp.asarray(alpha, jnp.float32), delta)
        return dx, ddelta, col_sum(dgamma), col_sum(dbeta), dalpha.sum()
    if residual:
        dx, ddelta, dgamma, dbeta = call(h, dy, gamma, mean, rstd, dh, jnp.asarray(alpha, jnp.float32))
        return dx, ddelta, col_sum(dgamma), col_sum(dbeta), None
    dx, dgamma, dbeta = call(h, dy, gamma, mean, rstd)
    return dx, None, col_sum(dgamma), col_sum(dbeta), None


# ----------------------------------------------------------------------------- bias + GELU


def gelu_and_grad(u):
    """tanh GELU (the ANDREA document's formula) and its derivative, float32."""
    t = jnp.tanh(_GELU_C * (u + _GELU_K * u * u * u))
    gelu = 0.5 * u * (1.0 + t)
    dgelu = 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * _GELU_C * (1.0 + 3.0 * _GELU_K * u * u)
    return gelu, dgelu


def _gelu_tiles(n_rows, n_cols):
    cols_p2 = pl.next_power_of_2(n_cols)
    if _interpret():
        block_cols = cols_p2
        block_rows = max(1, min(_CPU_TILE_ELEMS // cols_p2, pl.next_power_of_2(n_rows)))
    else:
        block_cols = min(cols_p2, GPU_TILING.gelu_cols)
        block_rows = GPU_TILING.gelu_rows
    return block_rows, block_cols


def _bias_gelu_fwd_kernel(h_ref, bias_ref, y_ref, *, n_rows, n_cols, block_rows, block_cols):
    rows = pl.program_id(0) * block_rows + jnp.arange(block_rows)
    cols = pl.program_id(1) * block_cols + jnp.arange(block_cols)
    col_ok = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_ok[None, :]
    bias = plgpu.load(bias_ref.at[cols], mask=col_ok, other=0).astype(jnp.float32)
    y, _ = gelu_and_grad(_load(h_ref, rows, cols, mask) + bias[None, :])
    _store(y_ref, rows, cols, mask, y)


def bias_gelu_fwd(h, bias):
    n_rows, n_cols = h.shape
    block_rows, block_cols = _gelu_tiles(n_rows, n_cols)
    kernel = functools.partial(_bias_gelu_fwd_kernel, n_rows=n_rows, n_cols=n_cols,
                               block_rows=block_rows, block_cols=block_cols)
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(h.shape, h.dtype),
                          grid=(pl.cdiv(n_rows, block_rows), pl.cdiv(n_cols, block_cols)),
                          interpret=_interpret(), name="bias_gelu_fwd",
                          **_params(GPU_TILING.gelu_warps))(h, bias)


def _bias_gelu_bwd_kernel(h_ref, bias_ref, dy_ref, dh_ref, dbias_ref, *, n_rows, n_cols,
                          block_rows, block_cols, n_sub):
    pid = pl.program_id(0)
    cols = pl.program_id(1) * block_cols + jnp.arange(block_cols)
    col_ok = cols < n_cols
    bias = plgpu.load(bias_ref.at[cols], mask=col_ok, other=0).astype(jnp.float32)

    def body(i, dbias):
        rows = (pid * n_sub + i) * block_rows + jnp.arange(block_rows)
        mask = (rows < n_rows)[:, None] & col_ok[None, :]
        _, dgelu = gelu_and_grad(_load(h_ref, rows, cols, mask) + bias[None, :])
        dh = _load(dy_ref, rows, cols, mask) * dgelu
        _store(dh_ref, rows, cols, mask, dh)
        return dbias + jnp.sum(dh, axis=0)

    dbias = lax.fori_loop(0, n_sub, body, jnp.zeros((block_cols,), jnp.float32))
    plgpu.store(dbias_ref.at[pid * n_cols + cols], dbias, mask=col_ok)


def bias_gelu_bwd(h, bias, dy):
    """Returns (dh [R, F] in h's dtype, dbias [F] float32 summed over the local rows)."""
    n_rows, n_cols = h.shape
    block_rows, block_cols = _gelu_tiles(n_rows, n_cols)
    n_blocks = pl.cdiv(n_rows, block_rows)
    col_programs = pl.cdiv(n_cols, block_cols)
    # Each of the col_programs column blocks has its own programs, so they share the target.
    n_sub = min(n_blocks, _sub_blocks(n_blocks * col_programs, block_rows))
    programs = pl.cdiv(n_blocks, n_sub)
    kernel = functools.partial(_bias_gelu_bwd_kernel, n_rows=n_rows, n_cols=n_cols,
                               block_rows=block_rows, block_cols=block_cols, n_sub=n_sub)
    dh, dbias = pl.pallas_call(
        kernel, out_shape=[jax.ShapeDtypeStruct(h.shape, h.dtype),
                           jax.ShapeDtypeStruct((programs * n_cols,), jnp.float32)],
        grid=(programs, col_programs), interpret=_interpret(), name="bias_gelu_bwd",
        **_params(GPU_TILING.gelu_warps, GPU_TILING.bwd_stages))(h, bias, dy)
    return dh, dbias.reshape(programs, n_cols).sum(0)
