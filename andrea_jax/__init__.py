"""ANDREA-JAX: pretrain ANDREA-120M with ProRes in JAX/Flax (README.md; the layout: docs/ARCHITECTURE.md).

One thing happens on import, and only on a machine that has the CUDA plugin installed but no NVIDIA
driver (the gpu-compile extra on a CPU machine, as in CI): jax is imported and its plugins
registered with the process's native stderr silenced. The plugin's libraries print "Could not find
cuda drivers" there, from C++ before any logging is set up, at jax's import and again when the
plugin registers; that would precede every command's output and its one-line errors. The plugin
still registers (andrea_jax.aot compiles through it), JAX_PLATFORMS defaults to cpu (the only
platform such a machine runs), and a machine with a driver is left alone.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import sys


@contextlib.contextmanager
def native_stderr_silenced():
    """fd 2 to /dev/null for the block: what C++ code prints there is dropped (Python's too)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _cuda_plugin_without_driver() -> bool:
    if "jax" in sys.modules or os.path.exists("/proc/driver/nvidia"):
        return False
    return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None


if _cuda_plugin_without_driver():
    # Without a driver JAX can only run on the CPU; saying so up front also makes the plugin skip
    # its CUDA version check, which would fail and leave it unregistered (aot needs it registered).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    with native_stderr_silenced():
        import jax  # noqa: F401  (the import is what prints)
        from jax._src import xla_bridge

        # registration only: no backend is created (jax.distributed.initialize may still follow)
        xla_bridge._discover_and_register_pjrt_plugins()
