"""Fused ops for transformer blocks, with one dispatch point that picks the backend.

Stands alone: usable by any JAX model, imports nothing of andrea_jax but its errors and the names of
its backends (andrea_jax.names.KERNEL_IMPLS, which the config checks `kernels.impl` against).
Backends (`impl`):
- `xla`: the jnp reference in `reference.py`, left to XLA's own fusion;
- `pallas`: Pallas kernels (`pallas_ops.py`) under `jax.custom_vjp` (`fused.py`); Triton-lowered
  on GPU, `interpret=True` elsewhere;
- `triton`: hand-written Triton kernels through `jax_triton.triton_call` (`triton_ops.py`); GPU only;
- `auto`: `xla` everywhere, GPU included, until a GPU measurement of the whole train step shows
  a kernel backend faster (per-op timings alone do not decide it; docs/BENCHMARKS.md).
The kernel backends run per row shard under a mesh (`sharded.py`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from andrea_jax.kernels import reference
from andrea_jax.kernels.platform import target_backend  # noqa: F401  (the model asks it too)
from andrea_jax.errors import KernelUnavailableError  # noqa: F401  (callers catch it here)
from andrea_jax.names import KERNEL_IMPLS as IMPLS


def resolve(impl: str) -> str:
    """The backend `impl` stands for on this machine: 'auto' is 'xla' on every backend, pending a
    GPU measurement of the whole train step that shows a kernel backend faster."""
    if impl not in IMPLS:
        raise ValueError(f"unknown kernel impl {impl!r}; known: {', '.join(IMPLS)}")
    if impl == "auto":
        return "xla"
    return impl


def _backend(impl: str):
    name = resolve(impl)
    if name == "xla":
        return None
    if name == "pallas":
        from andrea_jax.kernels import pallas_ops
        return pallas_ops
    from andrea_jax.kernels import triton_ops  # raises KernelUnavailableError naming the missing extra
    triton_ops.check_available()
    return triton_ops


def _check_features(name: str, x, *params):
    D = x.shape[-1] if x.ndim else None
    for p in params:
        if p.shape != (D,):
            raise ValueError(f"{name}: parameter of shape {p.shape} does not match the feature "
                             f"dimension of input {x.shape} (expected ({D},))")


def _dtype_name(y_dtype) -> str | None:
    return None if y_dtype is None else jnp.dtype(y_dtype).name  # hashable: the fused fns are cached by it


def layer_norm(x, gamma, beta, *, eps: float = 1e-5, impl: str = "auto", y_dtype=None):
    """LayerNorm over the last axis; statistics in float32, output in y_dtype (default x's): a
    float32 stream normalised for a bf16 matmul is written once, in bf16, by the kernel."""
    _check_features("layer_norm", x, gamma, beta)
    backend = _backend(impl)
    if backend is None or x.size == 0:
        return reference.layer_norm(x, gamma, beta, eps=eps, y_dtype=y_dtype)
    from andrea_jax.kernels import fused
    return fused.layer_norm_fn(backend, float(eps), _dtype_name(y_dtype))(x, gamma, beta)


def residual_layer_norm(x, delta, alpha, gamma, beta, *, eps: float = 1e-5, impl: str = "auto", y_dtype=None):
    """(h, y) with h = x + alpha * delta (in x's dtype) and y = LayerNorm(h) (in y_dtype, default x's)."""
    _check_features("residual_layer_norm", x, gamma, beta)
    if delta.shape != x.shape:
        raise ValueError(f"residual_layer_norm: delta {delta.shape} must have the shape of x {x.shape}")
    backend = _backend(impl)
    if backend is None or x.size == 0:
        return reference.residual_layer_norm(x, delta, alpha, gamma, beta, eps=eps, y_dtype=y_dtype)
    from andrea_jax.kernels import fused
    alpha = jnp.asarray(alpha, jnp.float32)
    if alpha.shape != ():
        raise ValueError(f"residual_layer_norm: alpha must be a scalar, got shape {alpha.shape}")
    return fused.residual_layer_norm_fn(backend, float(eps), _dtype_name(y_dtype))(
        x, delta.astype(x.dtype), alpha, gamma, beta)


# The xla backend's GELU saves only its inputs for the backward pass, which recomputes the
# elementwise forward (fused into the derivative), as the kernels' custom VJP does. Left to
# autodiff it would save seven more [rows, F] intermediates (u, u^3, tanh, ...): in a layer scan
# they are stacked for every layer, and on CPU writing and reading them back costs more than the
# recomputation (benchmarks/profile_backward.py measures both). Same function, same gradients.
_bias_gelu_saving_inputs = jax.checkpoint(reference.bias_gelu)


def bias_gelu(h, bias, *, impl: str = "auto"):
    """tanh GELU of h + bias, computed in float32, output in h's dtype."""
    _check_features("bias_gelu", h, bias)
    backend = _backend(impl)
    if backend is None or h.size == 0:
        return _bias_gelu_saving_inputs(h, bias)
    from andrea_jax.kernels import fused
    return fused.bias_gelu_fn(backend)(h, bias)
