"""The platform a traced program is for: JAX's default backend, unless set for a compile ahead of time.

andrea_jax.aot compiles for a GPU that is not attached (the CUDA plugin's deviceless compile)
inside `target("gpu", capability)`, so that Pallas lowers through Triton rather than interpret
mode, jax-triton's kernels are lowered for that GPU, and attention may pick cuDNN.
"""
from __future__ import annotations

import contextlib

import jax

TARGET_BACKEND: str | None = None
# None: the attached GPU's. Lowering jax-triton's kernels for a GPU that is not attached (jax.export
# for cuda, or andrea_jax.aot) needs it given, e.g. 90 for an H100 / H200.
TARGET_COMPUTE_CAPABILITY: int | None = None


@contextlib.contextmanager
def target(backend: str | None, compute_capability: int | None = None):
    """Programs traced inside are for `backend` and, through jax-triton, `compute_capability`; the
    previous target comes back on leaving, an exception included."""
    global TARGET_BACKEND, TARGET_COMPUTE_CAPABILITY
    previous = TARGET_BACKEND, TARGET_COMPUTE_CAPABILITY
    TARGET_BACKEND, TARGET_COMPUTE_CAPABILITY = backend, compute_capability
    try:
        yield
    finally:
        TARGET_BACKEND, TARGET_COMPUTE_CAPABILITY = previous


def target_backend() -> str:
    """'gpu', 'cpu', ...: the platform the traced program will run on."""
    return TARGET_BACKEND or jax.default_backend()
