"""What the training loop does besides stepping: the hook functions and what they share.

A hook is `Hook(name, every, fn)`: `every` is N (every N steps) or a predicate of the step, and
`fn(ctx, state, step)` returns the metrics it adds to the step's line. `ctx` is the run's frozen
`Context` (settings, places, compiled steps, sinks); `state` the `LoopState` the loop carries
from step to step. andrea_jax/train/loop.py lists the hooks, their rules and their order.

`sync` is the host's wait for the devices: there it checks the loss of every step since the
last wait, so a non-finite loss is reported at its own step and before any checkpoint could
hold its update.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from andrea_jax import checkpoint
from andrea_jax.config import Config
from andrea_jax.data import pipeline
from andrea_jax.errors import TrainingError
from andrea_jax.train import diagnostics, mfu, optim, steps
from andrea_jax.train.metrics import MetricsLog, metric_line
from andrea_jax.workdir import Workdir


class Hook(NamedTuple):
    name: str
    every: int | Callable[[int], bool]  # N: every N steps (0: never); or whether a step owes it
    fn: Callable[["Context", "LoopState", int], dict]  # the metrics it adds to the step's line

    def due(self, step: int) -> bool:
        if callable(self.every):
            return bool(self.every(step))
        return bool(self.every) and step % self.every == 0


@dataclasses.dataclass(frozen=True)
class Context:
    """What does not change while the loop runs: the run's settings and places, the compiled
    steps, and where lines go (the metrics log keeps every step's loss, for the spike score)."""
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
    """What the loop carries from step to step."""
    train: object                 # the train state
    last_step: int                # the step of the last line (or the start)
    step_metrics: dict | None = None  # the latest step's, on the device
    pending_losses: list = dataclasses.field(default_factory=list)  # on the device until `sync`
    skipped: int | None = None    # updates skipped so far (optim.skip_nonfinite)
    spikes_seen: int = 0          # loss spikes skipped (optim.skip_spikes) already reported
    spike: dict | None = None     # the latest skipped spike not yet in a metric line
    lines: list = dataclasses.field(default_factory=list)  # the lines written by this call
    last_time: float = dataclasses.field(default_factory=time.perf_counter)  # when the last line was written


def _all_finite(tree):
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def report_spikes(ctx: Context, state: LoopState) -> None:
    """optim.skip_spikes: says on stderr how many loss spikes were skipped since the last wait and
    which blocks' gradient norms jumped most (over their window means) at the latest, and keeps
    that spike for the next metric line."""
    spikes = optim.spike_state(state.train.opt_state)
    if spikes is None:
        return
    s = jax.device_get(spikes._replace(inner_state=None))
    new = int(s.skipped) - state.spikes_seen
    if new <= 0:
        return
    state.spikes_seen = int(s.skipped)
    jump_L = [float(j) for j in s.last_jump_L]
    top = sorted(range(len(jump_L)), key=lambda l: -jump_L[l])[:3]
    spike = state.spike = {"spike_step": int(s.last_step) + 1, "spike_loss": float(s.last_loss),
                 "spike_window_mean": float(s.last_mean), "spike_window_std": float(s.last_std),
                 "spike_grad_jump": jump_L}
    if jax.process_index() == 0:  # through the bar, which would otherwise run into the line
        ctx.bar.write(f"warning: {new} loss spike(s) skipped (optim.skip_spikes={ctx.cfg.optim.skip_spikes}), "
                      f"{state.spikes_seen} so far; the latest at step {spike['spike_step']}: loss "
                      f"{spike['spike_loss']:.4f} against {spike['spike_window_mean']:.4f} +- "
                      f"{spike['spike_window_std']:.4f}; block gradient norms jumped most in "
              + ", ".join(f"block {l + 1} (x{jump_L[l]:.3g})" for l in top), file=sys.stderr)


def sync(ctx: Context, state: LoopState, step: int) -> None:
    """Waits for the devices; raises TrainingError at the first non-finite loss since the last
    wait (unless optim.skip_nonfinite) or when too many updates in a row were skipped."""
    new_losses = [float(v) for v in jax.device_get(state.pending_losses)]
    state.pending_losses.clear()
    ctx.metrics.step_losses += new_losses
    report_spikes(ctx, state)
    o = ctx.cfg.optim
    if not o.skip_nonfinite:
        bad = next((i for i, v in enumerate(new_losses) if not math.isfinite(v)), None)
        if bad is not None:
            raise TrainingError(f"non-finite loss {new_losses[bad]} at step {step - len(new_losses) + 1 + bad}; "
                                f"{ctx.where} (optim.skip_nonfinite=true skips such updates)")
        return
    counts = jax.device_get(optim.skip_counts(state.train.opt_state))
    in_a_row = int(counts["skipped_in_a_row"])
    if in_a_row >= o.max_consecutive_skips:
        raise TrainingError(f"the last {in_a_row} updates (steps {step - in_a_row + 1}-{step}) had non-finite "
                            f"gradients and were skipped (optim.max_consecutive_skips={o.max_consecutive_skips}): "
                            f"the run is stuck; {ctx.where}")
    state.skipped = int(counts["skipped_updates"])


def save_checkpoint(ctx: Context, state: LoopState, step: int) -> dict:
    if not bool(_all_finite(state.train.params)):  # a finite loss, then an overflowing update
        raise TrainingError(f"the parameters after step {step} are not finite; {ctx.where}")
    checkpoint.save(ctx.ckpt, step, state.train, pipeline.get_state(ctx.batches, ctx.cfg, ctx.corpus),
                    ctx.metrics.step_losses)
    return {}


def step_line(ctx: Context, state: LoopState, step: int) -> dict:
    """The step's own metrics, the throughput since the last line, each mixed source's tokens so far,
    and what sync saw."""
    line = metric_line(step, state.step_metrics)
    tokens = ctx.cfg.train.batch_size * ctx.cfg.model.seq_len * (step - state.last_step)
    line["tokens_per_sec"] = tokens / (time.perf_counter() - state.last_time)
    if ctx.peak_flops:
        line["mfu"] = mfu.mfu(line["tokens_per_sec"], ctx.flops_per_token, ctx.peak_flops, jax.device_count())
    line |= pipeline.tokens_by_source(ctx.cfg, ctx.corpus, step)   # data.mixture: cumulative, per source
    if state.skipped is not None:
        line["skipped_updates"] = state.skipped
    if state.spike is not None:
        line |= state.spike
        state.spike = None
    return line


def validate(ctx: Context, state: LoopState, step: int) -> dict:
    """The validation loss (and bits per byte, knockout) of the current parameters, printed."""
    if not ctx.val:
        return {}
    line = steps.evaluate(ctx.eval_step, state.train.params, state.train.step, ctx.val, ctx.bytes_per_token_V)
    loss = float(jax.device_get(state.step_metrics["loss"]))
    ctx.bar.write(f"step {step}: loss {loss:.4f}  val_loss {line['val_loss']:.4f}")
    if ctx.knockout_step is not None:
        line["knockout"] = steps.knockout(ctx.knockout_step, state.train.params, state.train.step, ctx.val,
                                          line["val_loss"])
    return line


def spike_score(ctx: Context, state: LoopState, step: int) -> dict:
    g = ctx.cfg.diagnostics
    return {"spike_score": diagnostics.spike_score(ctx.metrics.step_losses, g.spike_window, g.spike_sigmas)}


def write_line(ctx: Context, state: LoopState, step: int, line: dict) -> None:
    state.lines.append(line)
    ctx.metrics.write(line)
    ctx.bar.set_postfix({k: f"{line[k]:.3g}" for k in ("loss", "val_loss", "tokens_per_sec") if k in line})
    ctx.bar.update(step - ctx.bar.n)
    state.last_time, state.last_step = time.perf_counter(), step


def close(ctx: Context, state: LoopState) -> None:
    """At the end, however the loop ended: the losses up to a failed step are kept too."""
    ctx.bar.close()
    ctx.metrics.step_losses += [float(v) for v in jax.device_get(state.pending_losses)]
    ctx.metrics.close()
    if ctx.ckpt is not None:
        ctx.ckpt.wait_until_finished()  # train() closes it


def warn_unreadable(restored, ckpt) -> None:
    if restored.unreadable and jax.process_index() == 0:
        print(f"warning: {'; '.join(restored.unreadable)}: cannot be restored, left in place; resuming "
              f"from {ckpt.directory}/{restored.step}", file=sys.stderr, flush=True)
