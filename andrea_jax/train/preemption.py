"""Stopping a run cleanly on SIGTERM or SIGINT (a scheduler's preemption, Ctrl-C).

The handler only records the signal; the training loop asks between steps whether to stop, so
the step in flight completes and is checkpointed. A second signal stops the process at once, exit
128 + N without that checkpoint, whichever thread receives it and whatever the main thread is
blocked in (andrea_jax/signals.py counts signals in a thread of its own, since Python handlers run
only in the main thread, between bytecodes). In a multi-process run every process must stop after
the same step, so they agree on the request with one tiny all-gather, made only at the steps where
the loop already waits for the devices (log and checkpoint steps); a single process stops after
the very step during which the signal came.
"""
from __future__ import annotations

import signal
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils

from andrea_jax import signals

SIGNALS = signals.SIGNALS


class Stopped(Exception):
    """The run stopped early on a signal, after saving a checkpoint where it could."""

    def __init__(self, signum: int, step: int, checkpoint: str | None):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        saved = (f"checkpoint {checkpoint} saved; run the same command to continue" if checkpoint
                 else "no checkpoint saved (train.checkpoint_every=0)")
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}: {saved}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's code for a process ended by this signal


class StopRequests:
    """Catches SIGTERM and SIGINT while installed (a context, or install / uninstall): the first is
    recorded, a second stops the process at once. Only in the main thread; elsewhere signals keep
    their handlers and `agreed` only reports other processes' requests. uninstall restores the
    handlers that were there before."""

    def __init__(self):
        self.signum = 0
        self._first = signals.FirstSignal(self._handle)

    def install(self) -> "StopRequests":
        self._first.install()
        return self

    def uninstall(self) -> None:
        self._first.uninstall()

    def __enter__(self):
        return self.install()

    def __exit__(self, *exc):
        self.uninstall()

    def _handle(self, signum, frame):
        self.signum = signum
        print(f"\n{signal.Signals(signum).name}: stopping after this step, with a checkpoint "
              f"(send it again to stop at once)", file=sys.stderr, flush=True)

    def agreed(self, *, at_sync_point: bool) -> int:
        """The signal to stop on now (0: go on); the same on every process."""
        if jax.process_count() == 1:
            return self.signum
        if not at_sync_point:
            return 0
        return int(np.max(multihost_utils.process_allgather(np.asarray(self.signum, np.int32))))
