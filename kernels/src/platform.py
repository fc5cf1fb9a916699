"""The platform a traced program is for: JAX's default backend, unless set for a compile ahead of time.

andrea_jax.aot sets TARGET_BACKEND = "gpu" to compile for a GPU that is not attached (the CUDA
plugin's deviceless compile), so that Pallas lowers through Triton rather than interpret mode,
jax-triton's kernels may be lowered, and attention may pick cuDNN.
"""
from __future__ import annotations

import jax

TARGET_BACKEND: str | None = None


def target_backend() -> str:
    """'gpu', 'cpu', ...: the platform the traced program will run on."""
    return TARGET_BACKEND or jax.default_backend()
