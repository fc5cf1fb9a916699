"""Which settings a run may change when it resumes from its checkpoints.

A checkpoint continues exactly only under the settings that fix what a step computes and which
data it sees: the model, ProRes, the data's identity, the seed and the batch. Changing the length
of the run or the optimizer's schedule is allowed only when confirmed, since it re-stretches the
LR schedule from the current step on. Everything else (logging, evaluation, checkpointing,
kernels, the mesh, remat, the attention backend, and paths that only say where things are stored) is free: the data
loader still checks the content it resumes on (andrea_jax.data.loader.state_fingerprint).
"""
from __future__ import annotations

import json
import pathlib

from andrea_jax.config import Config

# Where things are stored, or how a step is computed without changing what it computes.
FREE = {"model.remat", "model.attention", "data.path", "data.data_dir", "data.tokenizer", "data.tfds_download"}
IDENTITY_SECTIONS = ("model", "prores", "data")
IDENTITY_KEYS = ("train.seed", "train.batch_size")
# Only matter to a step whose gradient is not finite: switching skipping on to get past a NaN is fine.
SCHEDULE_FREE = {"optim.skip_nonfinite", "optim.max_consecutive_skips"}


class ResumeError(RuntimeError):
    """The workdir's checkpoints come from a run with other settings; the message names them."""


def _flat(config: dict) -> dict:
    return {f"{section}.{key}": value for section, fields in config.items() if isinstance(fields, dict)
            for key, value in fields.items()}


def changed_settings(saved: dict, now: dict) -> tuple[list[str], list[str]]:
    """(identity, schedule): the `section.key (saved X, now Y)` of each setting that differs
    between two Config.to_dict() trees. A key the saved config lacks (a field added since) counts
    as its default."""
    before = _flat(Config().to_dict()) | _flat(saved)
    identity, schedule = [], []
    for key, value in _flat(now).items():
        if key in FREE or before.get(key) == value:
            continue
        section = key.split(".")[0]
        described = f"{key} (saved {before.get(key)!r}, now {value!r})"
        if section in IDENTITY_SECTIONS or key in IDENTITY_KEYS:
            identity.append(described)
        elif key == "train.steps" or (section == "optim" and key not in SCHEDULE_FREE):
            schedule.append(described)
    return identity, schedule


def check(workdir: pathlib.Path, cfg: Config, *, allow_schedule_change: bool) -> None:
    """Raises ResumeError unless `cfg` may continue the checkpoints of `workdir`, whose run saved
    its settings in workdir/config.json (a workdir without one is not checked here)."""
    path = workdir / "config.json"
    if not path.is_file():
        return
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ResumeError(f"{path} cannot be read ({e}); it says which settings the checkpoints "
                          f"in {workdir / 'checkpoints'} were trained with") from None
    identity, schedule = changed_settings(saved, cfg.to_dict())
    if identity:
        raise ResumeError(f"{workdir} holds checkpoints of a run with other settings: {', '.join(identity)}; "
                          f"use the same settings or another workdir")
    if schedule and not allow_schedule_change:
        raise ResumeError(f"{workdir} holds checkpoints of a run with another schedule: {', '.join(schedule)}; "
                          f"resuming would re-stretch the learning-rate schedule from the current step "
                          f"on: pass --allow-schedule-change to do so, or use the same settings")
