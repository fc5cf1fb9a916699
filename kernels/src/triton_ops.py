"""Hand-written Triton kernels of the fused ops, called through `jax_triton.triton_call` (GPU only).

Same contract and the same math as `kernels.pallas_ops` (2-D [rows, D] arrays, float32 statistics,
partial row-sums per program summed by the caller), so `kernels.fused` wraps either one.
Importing this module needs `triton` and `jax_triton` (the cuda12 extra); without them it raises
a `KernelUnavailableError` (a `MissingExtraError`) naming the extra.
"""
from __future__ import annotations

import inspect
import os
import pathlib

import jax
import jax.numpy as jnp

from andrea_jax.errors import KernelExtraMissing, KernelUnavailableError, is_missing

try:
    import jax_triton as jt
    import triton
    import triton.language as tl
except ImportError as err:  # an install without the cuda12 extra has neither
    if not is_missing(err, "jax_triton", "triton"):
        raise
    raise KernelExtraMissing("kernels.impl=triton", "cuda12") from None

from andrea_jax.kernels import pallas_ops, platform


def _cuda12_ptxas() -> str | None:
    """The ptxas of the nvidia-cuda-nvcc-cu12 wheel (jax[cuda12]'s, the one XLA assembles with)."""
    try:
        import nvidia.cuda_nvcc
    except ImportError:
        return None
    path = pathlib.Path(list(nvidia.cuda_nvcc.__path__)[0]) / "bin" / "ptxas"
    return str(path) if path.is_file() else None


def pin_ptxas() -> None:
    """Triton writes PTX of the newest version its ptxas reads: triton 3.9 brings a CUDA 13 ptxas
    and writes `.version 9.4` for sm_90, which the CUDA 12.9 ptxas of jax[cuda12] rejects at the
    kernel's first launch ("Unsupported .version 9.4; current version is '8.8'"). Pointing
    triton at the CUDA 12 ptxas (sm_90 and up use its `ptxas_blackwell` tool) makes it write PTX
    that ptxas assembles (8.8). A path the user set wins."""
    ptxas = _cuda12_ptxas()
    if ptxas:
        os.environ.setdefault("TRITON_PTXAS_PATH", ptxas)
        os.environ.setdefault("TRITON_PTXAS_BLACKWELL_PATH", ptxas)


pin_ptxas()


def check_available() -> None:
    if platform.target_backend() != "gpu":
        raise KernelUnavailableError(
            f"kernels impl='triton' runs only on a CUDA GPU, and this JAX backend is "
            f"{platform.target_backend()!r}; use impl='pallas' (interpret mode) or 'xla' here")


# jax-triton passes the arrays and scalars of *args first, then one pointer per output: every
# kernel below lists its inputs and scalars, then its outputs, then its constexprs.
# jax-triton renamed out_shape to out_type in 0.4; accept either.
_OUT_KW = "out_shape" if "out_shape" in inspect.signature(jt.triton_call).parameters else "out_type"


def _call(*args, kernel, out, grid, num_warps, num_stages=1, **meta):
    return jt.triton_call(*args, kernel=kernel, grid=grid, num_warps=num_warps, num_stages=num_stages,
                          compute_capability=platform.TARGET_COMPUTE_CAPABILITY, **{_OUT_KW: out}, **meta)


def _sub_blocks(n_tiles: int, block_rows: int) -> int:
    tiling = pallas_ops.GPU_TILING
    return max(_cdiv(n_tiles, tiling.target_programs), _cdiv(tiling.min_rows_per_program, block_rows))


def _p2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ----------------------------------------------------------------------------- LayerNorm


@triton.jit
def _ln_normalise(h, mask, cols, col_ok, rows, row_ok, offs, gamma_ptr, beta_ptr, y_ptr, mean_ptr,
                  rstd_ptr, n_cols, eps):
    mean = tl.sum(h, axis=1) / n_cols
    centred = tl.where(mask, h - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / n_cols + eps)
    gamma = tl.load(gamma_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = centred * rstd[:, None] * gamma[None, :] + beta[None, :]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + rows, mean, mask=row_ok)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def _row_tile(n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's BLOCK_R rows of a row-major [n_rows, n_cols] array, every column (BLOCK_D >=
    n_cols): the row and column indices, which of them are in bounds, and the element offsets."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    row_ok, col_ok = rows < n_rows, cols < n_cols
    mask = row_ok[:, None] & col_ok[None, :]
    offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    return rows, cols, row_ok, col_ok, mask, offs


@triton.jit
def _ln_fwd_kernel(x_ptr, gamma_ptr, beta_ptr, n_rows, n_cols, eps, y_ptr, mean_ptr, rstd_ptr,
                   BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows, cols, row_ok, col_ok, mask, offs = _row_tile(n_rows, n_cols, BLOCK_R, BLOCK_D)
    h = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    _ln_normalise(h, mask, cols, col_ok, rows, row_ok, offs, gamma_ptr, beta_ptr, y_ptr, mean_ptr,
                  rstd_ptr, n_cols, eps)


@triton.jit
def _residual_ln_fwd_kernel(x_ptr, delta_ptr, alpha_ptr, gamma_ptr, beta_ptr, n_rows, n_cols, eps,
                            h_ptr, y_ptr, mean_ptr, rstd_ptr,
                            BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows, cols, row_ok, col_ok, mask, offs = _row_tile(n_rows, n_cols, BLOCK_R, BLOCK_D)
    alpha = tl.load(alpha_ptr)
    h = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    h += alpha * tl.load(delta_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    h_stored = h.to(h_ptr.dtype.element_ty)  # normalise exactly the stream that is stored
    tl.store(h_ptr + offs, h_stored, mask=mask)
    _ln_normalise(h_stored.to(tl.float32), mask, cols, col_ok, rows, row_ok, offs, gamma_ptr,
                  beta_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, eps)


@triton.jit
def _ln_bwd_kernel(h_ptr, dy_ptr, gamma_ptr, mean_ptr, rstd_ptr, dh_ptr, delta_ptr, alpha_ptr,
                   n_rows, n_cols, n_sub, dx_ptr, ddelta_ptr, dgamma_ptr, dbeta_ptr, dalpha_ptr,
                   BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, RESIDUAL: tl.constexpr,
                   DALPHA: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < n_cols
    gamma = tl.load(gamma_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dgamma = tl.zeros((BLOCK_D,), tl.float32)
    dbeta = tl.zeros((BLOCK_D,), tl.float32)
    dalpha = tl.zeros((BLOCK_D,), tl.float32)
    alpha = 0.0
    if RESIDUAL:
        alpha = tl.load(alpha_ptr)
    for i in range(0, n_sub):
        rows = (pid * n_sub + i) * BLOCK_R + tl.arange(0, BLOCK_R)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & col_ok[None, :]
        offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
        mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        h = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        xhat = tl.where(mask, (h - mean[:, None]) * rstd[:, None], 0.0)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        g = dy * gamma[None, :]
        c_xhat = tl.sum(g * xhat, axis=1) / n_cols
        c_one = tl.sum(g, axis=1) / n_cols
        dx = (g - c_one[:, None] - xhat * c_xhat[:, None]) * rstd[:, None]
        if RESIDUAL:
            dx += tl.load(dh_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(ddelta_ptr + offs, (alpha * dx).to(ddelta_ptr.dtype.element_ty), mask=mask)
        if DALPHA:
            delta = tl.load(delta_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            dalpha += tl.sum(dx * delta, axis=0)
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dgamma += tl.sum(dy * xhat, axis=0)
        dbeta += tl.sum(dy, axis=0)
    tl.store(dgamma_ptr + pid * n_cols + cols, dgamma, mask=col_ok)
    tl.store(dbeta_ptr + pid * n_cols + cols, dbeta, mask=col_ok)
    if DALPHA:
        tl.store(dalpha_ptr + pid * n_cols + cols, dalpha, mask=col_ok)


def _norm_tiles(n_rows: int, n_cols: int):
    block_d = _p2(n_cols)
    block_r = max(1, min(pallas_ops.GPU_TILING.tile_elems // block_d, _p2(n_rows)))
    return block_r, block_d


def ln_fwd(x, gamma, beta, *, eps, delta=None, alpha=None, y_dtype=None):
    n_rows, n_cols = x.shape
    block_r, block_d = _norm_tiles(n_rows, n_cols)
    row = jax.ShapeDtypeStruct(x.shape, x.dtype)
    y_row = jax.ShapeDtypeStruct(x.shape, y_dtype or x.dtype)  # tl.store casts to the pointer's type
    stat = jax.ShapeDtypeStruct((n_rows,), jnp.float32)
    grid = (_cdiv(n_rows, block_r),)
    meta = dict(BLOCK_R=block_r, BLOCK_D=block_d)
    if delta is None:
        y, mean, rstd = _call(x, gamma, beta, n_rows, n_cols, float(eps), kernel=_ln_fwd_kernel,
                              out=[y_row, stat, stat], grid=grid, num_warps=pallas_ops.GPU_TILING.norm_warps, **meta)
        return None, y, mean, rstd
    alpha = jnp.asarray(alpha, jnp.float32).reshape(1)
    h, y, mean, rstd = _call(x, delta, alpha, gamma, beta, n_rows, n_cols, float(eps),
                             kernel=_residual_ln_fwd_kernel, out=[row, y_row, stat, stat], grid=grid,
                             num_warps=pallas_ops.GPU_TILING.norm_warps, **meta)
    return h, y, mean, rstd


def ln_bwd(h, dy, gamma, mean, rstd, *, dh=None, alpha=None, delta=None):
    """As `pallas_ops.ln_bwd`: residual form with dh and alpha; dalpha only when delta is given."""
    n_rows, n_cols = h.shape
    block_r, block_d = _norm_tiles(n_rows, n_cols)
    n_blocks = _cdiv(n_rows, block_r)
    n_sub = min(n_blocks, _sub_blocks(n_blocks, block_r))
    programs = _cdiv(n_blocks, n_sub)
    residual = dh is not None
    with_dalpha = delta is not None
    if with_dalpha and not residual:
        raise ValueError("ln_bwd: dalpha (delta given) needs the residual form (dh and alpha)")
    # Pointers the kernel never touches (pruned by the constexprs): any live buffers will do.
    if not residual:
        dh, alpha = h, jnp.zeros((1,), jnp.float32)
    if not with_dalpha:
        delta = h
    alpha = jnp.asarray(alpha, jnp.float32).reshape(1)
    row = jax.ShapeDtypeStruct(h.shape, h.dtype)
    part = jax.ShapeDtypeStruct((programs * n_cols,), jnp.float32)
    ddelta_out = jax.ShapeDtypeStruct(h.shape if residual else (1,), h.dtype)
    dalpha_out = part if with_dalpha else jax.ShapeDtypeStruct((1,), jnp.float32)
    dx, ddelta, dgamma, dbeta, dalpha = _call(
        h, dy, gamma, mean, rstd, dh, delta, alpha, n_rows, n_cols, n_sub, kernel=_ln_bwd_kernel,
        out=[row, ddelta_out, part, part, dalpha_out], grid=(programs,),
        num_warps=pallas_ops.GPU_TILING.norm_warps, num_stages=pallas_ops.GPU_TILING.bwd_stages,
        BLOCK_R=block_r, BLOCK_D=block_d, RESIDUAL=residual, DALPHA=with_dalpha)
    col_sum = lambda p: p.reshape(programs, n_cols).sum(0)
    return (dx, ddelta if residual else None, col_sum(dgamma), col_sum(dbeta),
            dalpha.sum() if with_dalpha else None)


# ----------------------------------------------------------------------------- bias + GELU


@triton.jit
def _gelu_and_grad(u):
    z = 0.7978845608028654 * (u + 0.044715 * u * u * u)
    t = 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)  # tanh(z), saturating cleanly at +-1
    gelu = 0.5 * u * (1.0 + t)
    dgelu = 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * u * u)
    return gelu, dgelu


@triton.jit
def _bias_gelu_fwd_kernel(h_ptr, bias_ptr, n_rows, n_cols, y_ptr,
                          BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_ok[None, :]
    offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    bias = tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    u = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32) + bias[None, :]
    y, _ = _gelu_and_grad(u)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bias_gelu_bwd_kernel(h_ptr, bias_ptr, dy_ptr, n_rows, n_cols, n_sub, dh_ptr, dbias_ptr,
                          BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < n_cols
    bias = tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dbias = tl.zeros((BLOCK_C,), tl.float32)
    for i in range(0, n_sub):
        rows = (pid * n_sub + i) * BLOCK_R + tl.arange(0, BLOCK_R)
        mask = (rows < n_rows)[:, None] & col_ok[None, :]
        offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
        u = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32) + bias[None, :]
        _, dgelu = _gelu_and_grad(u)
        dh = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32) * dgelu
        tl.store(dh_ptr + offs, dh.to(dh_ptr.dtype.element_ty), mask=mask)
        dbias += tl.sum(dh, axis=0)
    tl.store(dbias_ptr + pid * n_cols + cols, dbias, mask=col_ok)


def _gelu_tiles(n_cols: int):
    return pallas_ops.GPU_TILING.gelu_rows, min(_p2(n_cols), pallas_ops.GPU_TILING.gelu_cols)


def bias_gelu_fwd(h, bias):
    n_rows, n_cols = h.shape
    block_r, block_c = _gelu_tiles(n_cols)
    return _call(h, bias, n_rows, n_cols, kernel=_bias_gelu_fwd_kernel,
                 out=jax.ShapeDtypeStruct(h.shape, h.dtype),
                 grid=(_cdiv(n_rows, block_r), _cdiv(n_cols, block_c)),
                 num_warps=pallas_ops.GPU_TILING.gelu_warps, BLOCK_R=block_r, BLOCK_C=block_c)


def bias_gelu_bwd(h, bias, dy):
    n_rows, n_cols = h.shape
    block_r, block_c = _gelu_tiles(n_cols)
    n_blocks, col_programs = _cdiv(n_rows, block_r), _cdiv(n_cols, block_c)
    n_sub = min(n_blocks, _sub_blocks(n_blocks * col_programs, block_r))
    programs = _cdiv(n_blocks, n_sub)
    dh, dbias = _call(h, bias, dy, n_rows, n_cols, n_sub, kernel=_bias_gelu_bwd_kernel,
                      out=[jax.ShapeDtypeStruct(h.shape, h.dtype),
                           jax.ShapeDtypeStruct((programs * n_cols,), jnp.float32)],
                      grid=(programs, col_programs), num_warps=pallas_ops.GPU_TILING.gelu_warps,
                      num_stages=pallas_ops.GPU_TILING.bwd_stages, BLOCK_R=block_r, BLOCK_C=block_c)
    return dh, dbias.reshape(programs, n_cols).sum(0)
