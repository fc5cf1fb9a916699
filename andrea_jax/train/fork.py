"""A cooldown forked from any stable-phase checkpoint: `train.py --fork-from RUN@STEP --workdir NEW
--set optim.decay_steps=K`.

The new run is the parent's run planned to end at STEP + K with a WSD decay of K steps: the same
config (model, data, seed, optimizer) with train.steps = STEP + K and optim.decay_steps = K,
recorded with train.fork_from = RUN@STEP in NEW/config.json. Its first checkpoint is a copy of the
parent's at STEP (state, optimizer, loader position, losses), so training continues from there
exactly as the planned run would; the parent's folder is only read. STEP must lie in the parent's
stable phase (after its warmup, before its decay), so that its LR so far is the planned run's. A
fork resumes like any run: run the same command again.
"""
from __future__ import annotations

import json
import pathlib
import shutil

from andrea_jax import config as config_lib, configs
from andrea_jax.config import Config
from andrea_jax.errors import ConfigError, LoadError
from andrea_jax.workdir import Workdir, changed_settings

# What a fork may change beside its length: how it runs, not what it computes. The rest of the
# schedule is the parent's, so that the LR up to STEP is the planned run's.
SCHEDULE_CHANGES = {"train.steps", "optim.decay_steps"}


def parse(spec: str) -> tuple[pathlib.Path, int]:
    run, sep, step = spec.rpartition("@")
    if not sep or not run or not step.isdigit():
        raise ConfigError(f"--fork-from {spec!r}: RUN@STEP, a run folder and one of its checkpoint steps")
    return pathlib.Path(run).resolve(), int(step)


def planned_config(parent: Config, step: int, sets: list[str], spec: str) -> Config:
    """The parent's config with `sets` applied, planned to end K = optim.decay_steps after `step`."""
    cfg = config_lib.override(parent, sets)
    decay = cfg.optim.decay_steps
    if cfg.optim.schedule != "wsd" or not decay:
        raise ConfigError(f"--fork-from needs a WSD parent and --set optim.decay_steps=K (the cooldown's steps); "
                          f"the parent's optim.schedule is {parent.optim.schedule}, decay_steps {decay}")
    p = parent.optim
    parent_decay = p.decay_steps or max(1, round(parent.train.steps * p.decay_fraction))
    stable_end = parent.train.steps - parent_decay
    if not p.warmup_steps <= step <= stable_end:
        raise ConfigError(f"--fork-from {spec}: step {step} is outside the parent's stable phase, steps "
                          f"{p.warmup_steps} to {stable_end} (warmup {p.warmup_steps}, decay from {stable_end})")
    # a budgeted parent's length is its budget's: the fork's is STEP + K, in steps
    cfg = config_lib.override(cfg, [f"train.steps={step + decay}", "train.tokens=0", "train.flops=0",
                                    f"train.fork_from={spec}"])
    identity, schedule = changed_settings(parent.to_dict(), cfg.to_dict())
    other = [s for s in schedule if s.split(" ")[0] not in SCHEDULE_CHANGES]
    if identity or other:
        raise ConfigError(f"--fork-from continues the parent's run, whose settings these change: "
                          f"{', '.join(identity + other)}")
    return config_lib.validate(cfg)


def prepare(spec: str, workdir, sets: list[str]) -> Config:
    """The fork's config; NEW's first checkpoint copied from the parent's, unless NEW holds the
    fork already (a resume)."""
    parent_dir, step = parse(spec)
    parent = Workdir(parent_dir)
    try:
        saved = json.loads(parent.config.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise LoadError(f"--fork-from {spec}: {parent.config} cannot be read ({e})") from None
    if step not in parent.checkpoint_steps():
        kept = ", ".join(map(str, parent.checkpoint_steps())) or "none"
        raise LoadError(f"--fork-from {spec}: {parent.checkpoints / str(step)} is no checkpoint; steps kept: {kept}")
    cfg = planned_config(configs.from_dict(saved), step, sets, f"{parent_dir}@{step}")
    new = Workdir(pathlib.Path(workdir).resolve())
    if new.checkpoint_steps():
        return cfg   # the fork resumes; the loop checks its config.json against cfg
    if new.root == parent.root:
        raise ConfigError(f"--fork-from {spec}: --workdir must be a new folder, not the parent's")
    new.checkpoints.mkdir(parents=True, exist_ok=True)
    shutil.copytree(parent.checkpoints / str(step), new.checkpoints / str(step))
    shutil.copy2(parent.tokenizer, new.tokenizer)
    return cfg
