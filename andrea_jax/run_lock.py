"""One run per workdir: process 0 holds an exclusive flock on WORKDIR/.lock for the run's life.

The kernel drops a flock when its holder exits, however it ends, so the lock of a dead run is
taken over without any clean-up; the file only records who held it last, for the message.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import socket
import time

import jax
import numpy as np
from jax.experimental import multihost_utils


class WorkdirBusy(RuntimeError):
    """Another live run holds the workdir."""


def try_lock(path: pathlib.Path):
    """(open file holding the lock, None) or (None, what the file says of its holder)."""
    f = path.open("a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "an unknown process"
        f.close()
        return None, holder
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    f.flush()
    return f, None


@contextlib.contextmanager
def held(workdir: pathlib.Path):
    """Holds the workdir's lock (process 0) while the block runs; every process raises
    WorkdirBusy when another run holds it."""
    path = workdir / ".lock"
    f, holder = try_lock(path) if jax.process_index() == 0 else (None, None)
    got = holder is None
    if jax.process_count() > 1:  # the other processes learn from process 0 whether to go on
        got = bool(np.all(multihost_utils.process_allgather(np.asarray(got))))
    if not got:
        raise WorkdirBusy(f"workdir {workdir} is in use by another run ({holder or 'seen by process 0'}, "
                          f"lock {path}); wait for it to end or use another workdir")
    try:
        yield
    finally:
        if f is not None:
            f.close()  # closing drops the flock
