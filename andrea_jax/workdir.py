"""A run's folder: the names of the files in it, the lock that keeps one run per workdir, and the
check of which settings a run may change when it resumes from the checkpoints there.

    WORKDIR/config.json        the resolved config (andrea_jax.config.Config.to_dict)
    WORKDIR/tokenizer.json     the BPE the run trained with
    WORKDIR/metrics.jsonl      one JSON line per logged step; step_losses.npy: every step's loss
    WORKDIR/checkpoints/STEP   Orbax checkpoints of the train state and the loader's position
    WORKDIR/tb                 TensorBoard events
    WORKDIR/.lock              flock of the live run

**Lock.** Process 0 holds an exclusive flock on WORKDIR/.lock for the run's life. The kernel drops
a flock when its holder exits, however it ends, so the lock of a dead run is taken over without
any clean-up; the file only records who held it last, for the message.

**Resume.** A checkpoint continues exactly only under the settings that fix what a step computes
and which data it sees: the model, ProRes, the data's identity, the seed and the batch. Changing
the length of the run or the optimizer's schedule is allowed only when confirmed, since it
re-stretches the LR schedule from the current step on. Everything else (logging, evaluation,
checkpointing, kernels, the mesh, remat, the attention backend, the loss's chunks, and paths that
only say where things are stored) is free: the data loader still checks the content it resumes on
(andrea_jax.data.loader.state_fingerprint).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import pathlib
import socket
import time

import numpy as np

from andrea_jax.config import Config
from andrea_jax.errors import ResumeError, WorkdirBusy, WorkdirError

CONFIG, TOKENIZER, METRICS, STEP_LOSSES = "config.json", "tokenizer.json", "metrics.jsonl", "step_losses.npy"
CHECKPOINTS, TENSORBOARD, LOCK = "checkpoints", "tb", ".lock"
WANDB_ID = "wandb_id"  # diagnostics.wandb: the W&B run id, kept so that a resumed run continues the same W&B run


@dataclasses.dataclass(frozen=True)
class Workdir:
    """The paths of one run's folder (nothing is created until `create`)."""
    root: pathlib.Path

    def __post_init__(self):
        object.__setattr__(self, "root", pathlib.Path(self.root))

    config = property(lambda self: self.root / CONFIG)
    tokenizer = property(lambda self: self.root / TOKENIZER)
    metrics = property(lambda self: self.root / METRICS)
    step_losses = property(lambda self: self.root / STEP_LOSSES)
    checkpoints = property(lambda self: self.root / CHECKPOINTS)
    tensorboard = property(lambda self: self.root / TENSORBOARD)
    lock = property(lambda self: self.root / LOCK)
    wandb_id = property(lambda self: self.root / WANDB_ID)

    def create(self) -> "Workdir":
        """Makes the folder; WorkdirError when the path is a file or cannot be written."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise WorkdirError(f"workdir {self.root} is (or is inside) an existing file, not a folder") from None
        except OSError as e:
            raise WorkdirError(f"workdir {self.root} cannot be created ({e.strerror or e})") from None
        return self

    def checkpoint_steps(self) -> list[int]:
        """Steps of the complete checkpoints, oldest first (orbax renames a folder when done)."""
        if not self.checkpoints.is_dir():
            return []
        return sorted(int(p.name) for p in self.checkpoints.iterdir() if p.is_dir() and p.name.isdigit())

    def held(self):
        """The run's lock, held while the block runs (see `held`)."""
        return held(self.root)

    def check_resume(self, cfg: Config, *, allow_schedule_change: bool) -> None:
        check(self.root, cfg, allow_schedule_change=allow_schedule_change)

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
    import jax  # here: what reads a run's files (a sweep, a report) need not start jax
    from jax.experimental import multihost_utils

    path = workdir / LOCK
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

# Where things are stored, or how a step is computed without changing what it computes.
FREE = {"model.remat", "model.attention", "model.loss_chunks", "data.path", "data.data_dir", "data.tokenizer",
        "data.tfds_download"}
IDENTITY_SECTIONS = ("model", "prores", "data")
IDENTITY_KEYS = ("train.seed", "train.data_seed", "train.batch_size", "train.batch_ramp")
# Only matter to a step whose gradient is not finite: switching skipping on to get past a NaN is fine.
SCHEDULE_FREE = {"optim.skip_nonfinite", "optim.max_consecutive_skips"}


def _flat(config: dict) -> dict:
    return {f"{section}.{key}": value for section, fields in config.items() if isinstance(fields, dict)
            for key, value in fields.items()}


def _changes_optimizer_tree(key: str, before: dict, after: dict) -> bool:
    """Another optimizer, spike skipping (which keeps its window of losses in the optimizer state)
    switched on or off or its window resized while on, or the moving average of the parameters
    switched on or off, gives a state that no checkpoint of the run can restore into."""
    if key == "optim.name":
        return True
    if key == "optim.ema":
        return bool(before.get(key)) != bool(after.get(key))
    on = lambda flat: bool(flat.get("optim.skip_spikes"))
    if key == "optim.skip_spikes":
        return on(before) != on(after)
    return key == "optim.skip_spikes_window" and (on(before) or on(after))


def changed_settings(saved: dict, now: dict) -> tuple[list[str], list[str]]:
    """(identity, schedule): the `section.key (saved X, now Y)` of each setting that differs
    between two Config.to_dict() trees. A key the saved config lacks (a field added since) counts
    as its default."""
    before = _flat(Config().to_dict()) | _flat(saved)
    identity, schedule = [], []
    after = _flat(now)
    for key, value in after.items():
        if key in FREE or before.get(key) == value:
            continue
        section = key.split(".")[0]
        described = f"{key} (saved {before.get(key)!r}, now {value!r})"
        if section in IDENTITY_SECTIONS or key in IDENTITY_KEYS or _changes_optimizer_tree(key, before, after):
            identity.append(described)
        elif key == "train.steps" or (section == "optim" and key not in SCHEDULE_FREE):
            schedule.append(described)
    return identity, schedule


def check(workdir: pathlib.Path, cfg: Config, *, allow_schedule_change: bool) -> None:
    """Raises ResumeError unless `cfg` may continue the checkpoints of `workdir`, whose run saved
    its settings in workdir/config.json (a workdir without one is not checked here)."""
    path = workdir / CONFIG
    if not path.is_file():
        return
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ResumeError(f"{path} cannot be read ({e}); it says which settings the checkpoints "
                          f"in {workdir / CHECKPOINTS} were trained with") from None
    identity, schedule = changed_settings(saved, cfg.to_dict())
    if identity:
        raise ResumeError(f"{workdir} holds checkpoints of a run with other settings: {', '.join(identity)}; "
                          f"use the same settings or another workdir")
    if schedule and not allow_schedule_change:
        raise ResumeError(f"{workdir} holds checkpoints of a run with another schedule: {', '.join(schedule)}; "
                          f"resuming would re-stretch the learning-rate schedule from the current step "
                          f"on: pass --allow-schedule-change to do so, or use the same settings")
