"""Orbax checkpoints of a run: the train state and the data loader's position, saved together.

A checkpoint is `WORKDIR/checkpoints/STEP/{state,data}`; orbax writes it to a temporary folder and
renames it when complete, so a run killed mid-save leaves the previous checkpoint intact.
"""
from __future__ import annotations

import pathlib

import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be restored: the message names it and says what to do."""


def manager(workdir: str | pathlib.Path, *, max_to_keep: int) -> ocp.CheckpointManager:
    directory = pathlib.Path(workdir).resolve() / "checkpoints"
    return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=True, enable_async_checkpointing=True))


def save(mngr: ocp.CheckpointManager, step: int, state, data_state: dict) -> None:
    """Starts an asynchronous save; training goes on while orbax writes."""
    mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                            data=ocp.args.JsonSave(data_state)), force=True)


def restore_latest(mngr: ocp.CheckpointManager, target_state):
    """(state, data_state) of the newest checkpoint, placed like `target_state`; None if there is none."""
    step = mngr.latest_step()
    if step is None:
        return None
    try:
        restored = mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target_state), data=ocp.args.JsonRestore()))
    except Exception as e:  # orbax/tensorstore raise many types; all mean the same to the user
        where = pathlib.Path(mngr.directory) / str(step)
        reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"checkpoint {where} cannot be restored ({type(e).__name__}: {reason}); it is left as it "
            f"is: move it away to resume from an earlier checkpoint, or use another workdir") from None
    return restored.state, restored.data


def read_data_state(workdir: str | pathlib.Path, step: int | None = None) -> dict:
    """The data loader's position saved with checkpoint `step` (default: the newest)."""
    with manager(workdir, max_to_keep=1 << 30) as mngr:
        step = mngr.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"{mngr.directory} holds no checkpoint")
        return mngr.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore())).data
