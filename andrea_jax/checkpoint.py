"""The checkpoint format of a run, written and read only here: the train state, the data
loader's position and the per-step losses, saved together by Orbax.

A checkpoint is `WORKDIR/checkpoints/STEP/{state,data,losses,format}` (the item names below);
orbax writes it to a temporary folder and renames it when complete, so a run killed mid-save leaves
the previous checkpoint intact. Restoring takes the newest checkpoint that can be read: one that cannot is reported and
left where it is, until the resumed run saves that step again and sets it aside as
`STEP.unreadable` (nothing is ever deleted but by `train.keep_checkpoints`).

**Format version.** Each checkpoint records FORMAT_VERSION in its `format` item. This code reads
every version up to its own (tests/data/golden_checkpoint_v1 is one of version 1, which every later
version must restore) and refuses a newer one in one line naming it, rather than falling back to an
older checkpoint of the run. A checkpoint without the item was written before versions were
recorded, in the layout of version 1, and is read as that.
"""
from __future__ import annotations

import dataclasses
import pathlib
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from andrea_jax.errors import CheckpointError
from andrea_jax.workdir import Workdir

# The items of a checkpoint: the train state (its `params` subtree is what inference reads), the
# loader's position, and the losses of steps 1..STEP.
STATE, DATA, LOSSES, FORMAT = "state", "data", "losses", "format"
LOSSES_KEY, VERSION_KEY = "step_losses", "version"
# The layout of the items above and of the train state's tree; raised with any change that an
# older reader could not restore (and the older golden checkpoints stay in tests/data).
FORMAT_VERSION = 1

@dataclasses.dataclass(frozen=True)
class Restored:
    step: int
    state: object
    data_state: dict        # the loader's position (andrea_jax.data.pipeline.get_state)
    step_losses: list       # the loss of every step 1..step, for the spike score
    unreadable: tuple       # newer checkpoints passed over, as "PATH (reason)"


def manager(workdir: str | pathlib.Path, *, max_to_keep: int) -> ocp.CheckpointManager:
    directory = Workdir(pathlib.Path(workdir).resolve()).checkpoints
    return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=True, enable_async_checkpointing=True))


def save(mngr: ocp.CheckpointManager, step: int, state, data_state: dict, step_losses) -> None:
    """Starts an asynchronous save; training goes on while orbax writes. `step_losses` are the
    losses of steps 1..step (non-finite ones are written as NaN / Infinity)."""
    if step in mngr.all_steps():  # only an unreadable checkpoint the run resumed before
        _set_aside(mngr, step)
    losses = [float(v) for v in np.asarray(step_losses, np.float32)]
    mngr.save(step, args=ocp.args.Composite(**{STATE: ocp.args.StandardSave(state),
                                               DATA: ocp.args.JsonSave(data_state),
                                               LOSSES: ocp.args.JsonSave({LOSSES_KEY: losses}),
                                               FORMAT: ocp.args.JsonSave({VERSION_KEY: FORMAT_VERSION})}), force=True)


def _set_aside(mngr: ocp.CheckpointManager, step: int) -> None:
    mngr.wait_until_finished()
    path = pathlib.Path(mngr.directory) / str(step)
    if jax.process_index() == 0:
        aside, n = path.with_name(f"{step}.unreadable"), 1
        while aside.exists():
            aside, n = path.with_name(f"{step}.unreadable{n}"), n + 1
        path.rename(aside)
        print(f"checkpoint {path} was unreadable and is kept as {aside}", file=sys.stderr, flush=True)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"andrea set aside checkpoint {step}")
    mngr.reload()


def _all_processes(ok: bool) -> bool:
    """Whether `ok` holds on every process (they must all restore the same checkpoint)."""
    if jax.process_count() == 1:
        return ok
    return bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))


def _reason(e: Exception) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


def format_version(step_dir: pathlib.Path) -> int:
    """The format version of the checkpoint in step_dir; CheckpointError, in one line naming it,
    when this code cannot read that version."""
    step_dir = pathlib.Path(step_dir)
    version = 1   # no format item: written before versions were recorded, in version 1's layout
    if (step_dir / FORMAT).is_dir():
        with ocp.Checkpointer(ocp.JsonCheckpointHandler()) as reader:
            version = reader.restore(step_dir / FORMAT).get(VERSION_KEY)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {step_dir} is of format version {version!r}, and this version of "
                              f"andrea_jax reads format versions 1 to {FORMAT_VERSION}: read it with the version "
                              f"that wrote it, or use another workdir")
    return version


def restore_newest_readable(mngr: ocp.CheckpointManager, target_state, among=None) -> Restored | None:
    """The newest checkpoint that every process can read, placed like `target_state`; None if
    there is no checkpoint. Raises CheckpointError when none of them can be read. `among`: only
    these steps are tried (a population restores its members at one step)."""
    unreadable = []
    steps = [s for s in mngr.all_steps() if among is None or s in among]
    for step in sorted(steps, reverse=True):
        restored, reason = None, "unreadable on another process"
        try:
            format_version(pathlib.Path(mngr.directory) / str(step))
            restored = mngr.restore(step, args=ocp.args.Composite(**{
                STATE: ocp.args.StandardRestore(target_state), DATA: ocp.args.JsonRestore(),
                LOSSES: ocp.args.JsonRestore()}))
            losses = restored[LOSSES][LOSSES_KEY]
            if len(losses) != step:
                raise ValueError(f"it holds {len(losses)} step losses, not {step}")
        except CheckpointError:
            raise   # a version this code cannot read: never passed over for an older checkpoint
        except Exception as e:  # orbax/tensorstore raise many types; all mean the same to the user
            restored, reason = None, _reason(e)
        if _all_processes(restored is not None):
            return Restored(step, restored[STATE], restored[DATA], [float(v) for v in losses], tuple(unreadable))
        unreadable.append(f"{pathlib.Path(mngr.directory) / str(step)} ({reason})")
    if unreadable:
        raise CheckpointError(f"no checkpoint of {mngr.directory} can be restored: {'; '.join(unreadable)}; "
                              f"they are left as they are: move them away to start afresh, or use another workdir")
    return None


# Where in the saved train state a parameter tree lies: the parameters, or (optim.ema) their moving
# average inside the optimizer state (andrea_jax.train.optim.EmaState, outermost).
WEIGHTS = {"params": ("params",), "ema": ("opt_state", "ema")}


def read_params(step_dir: pathlib.Path, params_target, weights: str = "params"):
    """The parameter tree `weights` (a key of WEIGHTS) of the train state saved in step_dir, read
    alone (never the rest of the optimizer state), placed as the jax.ShapeDtypeStructs of
    `params_target` say."""
    format_version(step_dir)
    path = WEIGHTS[weights]
    target = params_target
    for key in reversed(path):
        target = {key: target}
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    with ocp.PyTreeCheckpointer() as ckptr:
        restored = ckptr.restore(pathlib.Path(step_dir) / STATE, args=ocp.args.PyTreeRestore(
            item=target, restore_args=restore_args, partial_restore=True))
    for key in path:
        restored = restored[key]
    return restored
