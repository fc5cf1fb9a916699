"""What a command does before it first uses jax: keep a CUDA plugin without a GPU quiet.

On a machine that has JAX's CUDA plugin installed but no NVIDIA driver (the gpu-compile extra on a
CPU machine, as in CI), the plugin's libraries print "Could not find cuda drivers" from C++, before
any logging is set up, when jax is imported and again when the plugin registers at the first use
of a backend. That would precede every command's output and its one-line errors. Such a machine
can only compute on the CPU, so JAX_PLATFORMS defaults to cpu there (which also makes the plugin
skip its CUDA version check, which would fail and leave it unregistered; aot needs it registered),
and jax's import and its backends' creation run with the native stderr silenced. A machine with a
driver, or without the plugin (a plain `pip install -e .`), is left alone.

Called by every command's entry point and by tests/conftest.py; never at import time.
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


def cuda_plugin_without_driver() -> bool:
    """JAX's CUDA plugin is installed and this machine has no NVIDIA driver."""
    if os.path.exists("/proc/driver/nvidia"):
        return False
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except (ImportError, ValueError):  # no jax_plugins namespace at all: the plugin is not installed
        return False


# XLA:GPU's deterministic implementations of what it would otherwise run with atomics or a
# nondeterministic algorithm (scatter, GEMMs, cuDNN's attention backward, reductions), and no
# autotuning: a compile that times candidates can pick another kernel, with other rounding, each time
# it compiles (and a resume recompiles). XLA:CPU is deterministic without them.
DETERMINISTIC_XLA_FLAGS = {"xla_gpu_exclude_nondeterministic_ops": "true", "xla_gpu_autotune_level": "0"}


def _flag_values(xla_flags: str) -> dict[str, str]:
    return dict((f.lstrip("-").split("=", 1) + ["true"])[:2] for f in xla_flags.split() if f.startswith("--"))


def with_deterministic_flags(xla_flags: str) -> str:
    """XLA_FLAGS `xla_flags` with DETERMINISTIC_XLA_FLAGS added; a ConfigError where it sets one of
    them otherwise."""
    from andrea_jax.errors import ConfigError
    values = _flag_values(xla_flags)
    for name, value in DETERMINISTIC_XLA_FLAGS.items():
        if values.get(name, value) != value:
            raise ConfigError(f"train.deterministic=true needs --{name}={value}, but XLA_FLAGS sets "
                              f"--{name}={values[name]}")
    missing = [f"--{k}={v}" for k, v in DETERMINISTIC_XLA_FLAGS.items() if k not in values]
    return " ".join([xla_flags.strip(), *missing]).strip()


def has_deterministic_flags(xla_flags: str) -> bool:
    values = _flag_values(xla_flags)
    return all(values.get(k) == v for k, v in DETERMINISTIC_XLA_FLAGS.items())


def import_jax() -> None:
    """Imports jax, quietly where the CUDA plugin has no driver; creates no backend, so that
    jax.distributed.initialize may still follow."""
    if "jax" in sys.modules or not cuda_plugin_without_driver():
        return
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    with native_stderr_silenced():
        import jax  # noqa: F401  (the import is what prints)


def start_jax() -> None:
    """Imports jax and creates its backends (the plugins register then), quietly where the CUDA
    plugin has no driver. After this, jax.distributed.initialize can no longer be called."""
    quiet = cuda_plugin_without_driver()
    if quiet:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    with native_stderr_silenced() if quiet else contextlib.nullcontext():
        import jax
        jax.devices()
