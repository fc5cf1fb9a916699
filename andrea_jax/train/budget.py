"""A run's length given as a budget: `train.tokens` or `train.flops` instead of `train.steps`.

`resolve` turns the budget into `train.steps` once, when the command starts and before anything
compiles; the loop and everything after it read only `train.steps`, and config.json records it
beside the budget that gave it. A step trains `train.batch_size x model.seq_len` tokens (the
targets of its rows; microbatches split a step, they do not add to it), and a token costs the FLOPs
the `mfu` metric counts (andrea_jax.train.mfu.model_flops_per_token). Steps round up: the run
trains at least its budget and less than one step more. With a ramp (andrea_jax.ramps) the steps
are those of its plan that see train.tokens.

A resumed run takes the steps its config.json recorded for the same budget rather than resolving
again, so that it ends where it was planned to even if the FLOP count's formula changes between
versions; the other settings the steps depend on (the batch, the model) are the ones a resume may
not change (andrea_jax.workdir).
"""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Sequence

import jax

from andrea_jax import ramps
from andrea_jax.config import Config
from andrea_jax.errors import ConfigError
from andrea_jax.train import mfu
from andrea_jax.workdir import Workdir


def tokens_per_step(cfg: Config) -> int:
    """Tokens of a step of the full shape (a ramp's earlier steps see fewer: andrea_jax.ramps)."""
    return ramps.full_tokens(cfg)


def steps_for(cfg: Config) -> int | None:
    """The steps train.tokens or train.flops asks for; None when neither is set."""
    t = cfg.train
    if t.tokens:
        return ramps.steps_for_tokens(cfg, t.tokens)  # integer ceil over the plan's steps: exact at any size
    if t.flops:
        return math.ceil(t.flops / (mfu.model_flops_per_token(cfg.model) * tokens_per_step(cfg)))
    return None


def _inputs(tree: dict) -> tuple:
    """What a budget's steps depend on, from a Config.to_dict() tree."""
    train = tree.get("train", {})
    return (train.get("tokens", 0), train.get("flops", 0.0), train.get("batch_size"), train.get("batch_ramp", ""),
            tree.get("model"))


def _recorded_steps(cfg: Config, workdir: str | pathlib.Path | None) -> int | None:
    """The steps the run in `workdir` recorded for this same budget, batch and model, if its
    config.json says so."""
    if workdir is None:
        return None
    try:
        saved = json.loads(Workdir(workdir).config.read_text())
        steps = saved["train"]["steps"]
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: the resume check says so
        return None
    same = _inputs(saved) == _inputs(cfg.to_dict())
    return steps if same and isinstance(steps, int) and steps > 0 else None


def resolve(cfg: Config, explicit: Sequence[str] = (), workdir: str | pathlib.Path | None = None) -> Config:
    """`cfg` with train.steps set by its budget (unchanged without one). `explicit` is the command's
    `--set` assignments: train.steps set there beside a budget is refused (a config file's steps are
    the default a budget replaces)."""
    t = cfg.train
    key = "train.tokens" if t.tokens else "train.flops" if t.flops else None
    if key is None:
        return cfg
    if any(a.partition("=")[0].strip() == "train.steps" for a in explicit):
        raise ConfigError(f"train.steps: set beside {key}={getattr(t, key.split('.')[1])}; set only one of "
                          f"train.steps, train.tokens and train.flops ({key}=0 lets train.steps set the length)")
    steps = _recorded_steps(cfg, workdir) or steps_for(cfg)
    return dataclasses.replace(cfg, train=dataclasses.replace(t, steps=steps))


def describe(cfg: Config) -> str:
    """One line saying what the budget resolved to ('' without a budget)."""
    t = cfg.train
    if not (t.tokens or t.flops):
        return ""
    per_step = tokens_per_step(cfg)
    budget = f"train.tokens={t.tokens:,}" if t.tokens else f"train.flops={t.flops:.4g}"
    if ramps.ramped(cfg):   # a ramp refuses train.flops: its steps have other shapes and FLOPs per token
        return f"{budget}: train.steps={t.steps:,} of a ramp, {ramps.tokens_at(cfg, t.steps):,} tokens"
    flops = t.steps * per_step * mfu.model_flops_per_token(cfg.model)
    return (f"{budget}: train.steps={t.steps:,} of {per_step:,} tokens (train.batch_size x model.seq_len), "
            f"{t.steps * per_step:,} tokens, {flops:.4g} FLOPs")


def announce(cfg: Config) -> None:
    """Process 0 prints `describe`'s line (nothing without a budget)."""
    if (line := describe(cfg)) and jax.process_index() == 0:
        print(line, flush=True)
