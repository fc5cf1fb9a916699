"""What a GPU user expects of every run besides the loss: a profiler trace of chosen steps
(train.profile=START:END) and XLA's persistent compilation cache (train.compile_cache)."""
from __future__ import annotations

import os
import pathlib

import jax

from andrea_jax.data import tokenizer as tokenizer_lib


def use_compile_cache(enabled: bool) -> str | None:
    """Points XLA's persistent compilation cache at $ANDREA_CACHE/xla, so a rerun of the same
    program (a resume, a sweep's next seed) loads its executables instead of compiling them. An
    explicit JAX_COMPILATION_CACHE_DIR wins. Returns the folder in use, None when off."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    if not enabled:
        return None
    folder = tokenizer_lib.default_cache_dir() / "xla"
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    return str(folder)


class StepTrace:
    """jax.profiler's trace of steps START..END (train.profile), written to FOLDER (TensorBoard's
    profile tab or Perfetto read it): started before step START runs, stopped once step END's
    results exist, so the trace holds whole steps."""

    def __init__(self, spec: str, folder: pathlib.Path):
        start, _, end = spec.partition(":")
        self.window = (int(start), int(end)) if spec else None
        self.folder, self.active = folder, False

    def before(self, step: int) -> None:
        if self.window and step == self.window[0]:
            self.folder.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.folder))
            self.active = True

    def after(self, step: int, state) -> None:
        if self.active and step == self.window[1]:
            self.close(state)

    def close(self, state=None) -> None:
        if self.active:
            if state is not None:
                jax.block_until_ready(state)
            jax.profiler.stop_trace()
            self.active = False
