"""The hooks of the training loop: what a hook is, what it is given, and the hook functions.

A hook is `Hook(name, every, fn)`: `every` is N (every N steps) or a predicate of the step, and
`fn(ctx, state, step, line)` returns the metrics it adds to the step's line. `ctx` is the run's
frozen `Context` (settings, places, compiled steps, sinks); `state` the `LoopState` the loop
carries from step to step, which only the loop writes; `line` what the hooks due before it at
this step returned, merged (read-only). Hooks hand each other data only through what they
return. Two flags say what a hook needs of the loop: `on_stop` (also run at the step a signal
stops the run) and `writes_line` (the step's line is written when it is due). The loop never
reads a hook's name. andrea_jax/train/loop.py lists the hooks, their rules and their order, and
runs them.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp

from andrea_jax import checkpoint, ramps
from andrea_jax.config import Config
from andrea_jax.data import pipeline
from andrea_jax.errors import TrainingError
from andrea_jax.train import diagnostics, mfu, optim, steps
from andrea_jax.train.metrics import MetricsLog, metric_line
from andrea_jax.workdir import Workdir


class Hook(NamedTuple):
    name: str                     # for people and tests: the loop goes by the fields below
    every: int | Callable[[int], bool]  # N: every N steps (0: never); or whether a step owes it
    fn: Callable[["Context", "LoopState", int, Mapping], dict]  # the metrics it adds to the step's line
    on_stop: bool = False         # also due at the step a signal stops the run (the checkpoint)
    writes_line: bool = False     # when it is due the step's line is written (the log)

    def due(self, step: int) -> bool:
        if callable(self.every):
            return bool(self.every(step))
        return bool(self.every) and step % self.every == 0


@dataclasses.dataclass(frozen=True)
class Context:
    """What does not change while the loop runs: the run's settings and places, the compiled
    steps, and where lines go (the metrics log keeps every step's loss, for the spike score).
    andrea_jax.train.loop.context builds it."""
    cfg: Config
    run_dir: Workdir
    ckpt: object                  # orbax CheckpointManager; None with train.checkpoint_every=0
    batches: object               # the data iterator (its position is checkpointed)
    corpus: pipeline.TokenizedCorpus
    val: list                     # global validation batches
    eval_step: Callable
    bytes_per_token_V: jax.Array
    metrics: MetricsLog
    bar: object                   # tqdm progress bar
    knockout_step: Callable | None = None  # diagnostics.knockout: steps.make_knockout_step
    flops_per_token: float = 0.0  # the model's training FLOPs per token (andrea_jax/train/mfu.py)
    peak_flops: float | None = None  # per chip (train.peak_tflops or the device kind's); None: no mfu

    @property
    def where(self) -> str:
        return (f"metrics so far are in {self.run_dir.metrics}"
                + (f", checkpoints (none after the failure) in {self.ckpt.directory}" if self.ckpt else ""))

    def saved_at(self, step: int) -> str | None:
        return f"{self.ckpt.directory}/{step}" if self.ckpt is not None else None


@dataclasses.dataclass
class LoopState:
    """What the loop carries from step to step; the loop writes it, hooks only read it."""
    train: object                 # the train state
    last_step: int                # the step of the last line (or the start)
    step_metrics: dict | None = None  # the latest step's, on the device
    pending_losses: list = dataclasses.field(default_factory=list)  # on the device until the loop's wait
    spikes_seen: int = 0          # loss spikes skipped (optim.skip_spikes) already reported on stderr
    lines: list = dataclasses.field(default_factory=list)  # the lines written by this call
    last_time: float = dataclasses.field(default_factory=time.perf_counter)  # when the last line was written


@jax.jit  # one program per state's structure: op by op, each leaf's shape would compile two of its own
def _all_finite(tree):
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def latest_spike(opt_state) -> tuple[int, dict | None]:
    """optim.skip_spikes: how many loss spikes were skipped so far, and the latest one as a metric
    line's fields (None before the first, or with spike skipping off)."""
    spikes = optim.spike_state(opt_state)
    if spikes is None:
        return 0, None
    s = jax.device_get(spikes._replace(inner_state=None))
    if int(s.skipped) == 0:
        return 0, None
    return int(s.skipped), {"spike_step": int(s.last_step) + 1, "spike_loss": float(s.last_loss),
                            "spike_window_mean": float(s.last_mean), "spike_window_std": float(s.last_std),
                            "spike_grad_jump": [float(j) for j in s.last_jump_L]}


def save_checkpoint(ctx: Context, state: LoopState, step: int, line: Mapping) -> dict:
    if not bool(_all_finite(state.train.params)):  # a finite loss, then an overflowing update
        raise TrainingError(f"the parameters after step {step} are not finite; {ctx.where}")
    checkpoint.save(ctx.ckpt, step, state.train, pipeline.get_state(ctx.batches, ctx.cfg, ctx.corpus),
                    ctx.metrics.step_losses)
    return {}


def step_line(ctx: Context, state: LoopState, step: int, line: Mapping) -> dict:
    """The step's own metrics, the throughput since the last line (with a ramp, the tokens seen so
    far too), each mixed source's tokens so far, the updates skipped so far and the latest loss
    spike if no line holds it yet."""
    out = metric_line(step, state.step_metrics)
    tokens = ramps.tokens_at(ctx.cfg, step) - ramps.tokens_at(ctx.cfg, state.last_step)
    out["tokens_per_sec"] = tokens / (time.perf_counter() - state.last_time)
    if ramps.ramped(ctx.cfg):
        out["tokens"] = ramps.tokens_at(ctx.cfg, step)
    if ctx.peak_flops:
        out["mfu"] = mfu.mfu(out["tokens_per_sec"], ctx.flops_per_token, ctx.peak_flops, jax.device_count())
    out |= pipeline.tokens_by_source(ctx.cfg, ctx.corpus, step)   # data.mixture: cumulative, per source
    if ctx.cfg.optim.skip_nonfinite:
        out["skipped_updates"] = int(jax.device_get(optim.skip_counts(state.train.opt_state)["skipped_updates"]))
    _, spike = latest_spike(state.train.opt_state)
    if spike is not None and spike["spike_step"] > state.last_step:  # after the last line: not in one yet
        out |= spike
    return out


def validate(ctx: Context, state: LoopState, step: int, line: Mapping) -> dict:
    """The validation loss (and bits per byte, knockout) of the current parameters, printed."""
    if not ctx.val:
        return {}
    out = steps.evaluate(ctx.eval_step, state.train.params, state.train.step, ctx.val, ctx.bytes_per_token_V)
    loss = float(jax.device_get(state.step_metrics["loss"]))
    ctx.bar.write(f"step {step}: loss {loss:.4f}  val_loss {out['val_loss']:.4f}")
    if ctx.knockout_step is not None:
        out["knockout"] = steps.knockout(ctx.knockout_step, state.train.params, state.train.step, ctx.val,
                                         out["val_loss"])
    if (ema := optim.ema_params(state.train.opt_state)) is not None:
        averaged = steps.evaluate(ctx.eval_step, ema, state.train.step, ctx.val, ctx.bytes_per_token_V)
        out |= {f"{k}_ema": v for k, v in averaged.items()}
    return out


def spike_score(ctx: Context, state: LoopState, step: int, line: Mapping) -> dict:
    g = ctx.cfg.diagnostics
    return {"spike_score": diagnostics.spike_score(ctx.metrics.step_losses, g.spike_window, g.spike_sigmas)}
