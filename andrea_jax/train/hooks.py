"""What the training loop does besides stepping, each at its own cadence.

`due(cfg, step)` names what a step owes: `checkpoint` every train.checkpoint_every steps, `eval`
every train.eval_every, `diagnostics` every diagnostics.every (and at step 1), `log` every
train.log_every and with either of the last two; every one of them also at the last step. A
signal (preemption) adds `checkpoint`. `run_due` then runs the hooks in `HOOKS` order.

The host waits for the devices only when something is due (`sync`): there it checks the loss of
every step since the last wait, so a non-finite loss is reported at its own step and before any
checkpoint could hold its update.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp

from andrea_jax.config import Config
from andrea_jax.data import pipeline
from andrea_jax.errors import TrainingError
from andrea_jax.train import checkpoint, diagnostics, mfu, optim, preemption, steps
from andrea_jax.train.metrics import MetricsLog, metric_line
from andrea_jax.workdir import Workdir

SYNC = frozenset({"log", "checkpoint"})  # what needs the host to wait for the devices


@dataclasses.dataclass
class Run:
    """What the hooks share: the run's settings and places, and what the loop has produced."""
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
    state: object                 # the train state, updated by the loop
    start_step: int
    step_metrics: dict | None = None
    pending_losses: list = dataclasses.field(default_factory=list)  # on the device until `sync`
    skipped: int | None = None    # updates skipped so far (optim.skip_nonfinite)
    knockout_step: Callable | None = None  # diagnostics.knockout: steps.make_knockout_step
    tasks: dict = dataclasses.field(default_factory=dict)  # train.eval_tasks: {name: examples}
    flops_per_token: float = 0.0  # the model's training FLOPs per token (andrea_jax/train/mfu.py)
    peak_flops: float | None = None  # per chip (train.peak_tflops or the device kind's); None: no mfu
    spikes_seen: int = 0          # loss spikes skipped (optim.skip_spikes) already reported
    spike: dict | None = None     # the latest skipped spike not yet in a metric line
    line: dict | None = None      # the metric line being built at a log step
    log: list = dataclasses.field(default_factory=list)
    last_time: float = dataclasses.field(default_factory=time.perf_counter)
    last_step: int = 0

    @property
    def where(self) -> str:
        return (f"metrics so far are in {self.run_dir.metrics}"
                + (f", checkpoints (none after the failure) in {self.ckpt.directory}" if self.ckpt else ""))

    def saved_at(self, step: int) -> str | None:
        return f"{self.ckpt.directory}/{step}" if self.ckpt is not None else None


def _every(n: int, step: int) -> bool:
    return bool(n) and step % n == 0


def due(cfg: Config, step: int, *, has_checkpoints: bool) -> set[str]:
    t, last = cfg.train, step == cfg.train.steps
    names = {name for name, on in (
        ("checkpoint", has_checkpoints and (_every(t.checkpoint_every, step) or last)),
        ("eval", _every(t.eval_every, step) or last),
        ("diagnostics", bool(cfg.diagnostics.every) and (_every(cfg.diagnostics.every, step) or step == 1)),
    ) if on}
    if _every(t.log_every, step) or names & {"eval", "diagnostics"}:
        names.add("log")
    return names


@jax.jit
def _all_finite(tree):
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def report_spikes(run: Run) -> None:
    """optim.skip_spikes: says on stderr how many loss spikes were skipped since the last wait and
    which blocks' gradient norms jumped most (over their window means) at the latest, and keeps
    that spike for the next metric line."""
    spikes = optim.spike_state(run.state.opt_state)
    if spikes is None:
        return
    s = jax.device_get(spikes._replace(inner_state=None))
    new = int(s.skipped) - run.spikes_seen
    if new <= 0:
        return
    run.spikes_seen = int(s.skipped)
    jump_L = [float(j) for j in s.last_jump_L]
    top = sorted(range(len(jump_L)), key=lambda l: -jump_L[l])[:3]
    run.spike = {"spike_step": int(s.last_step) + 1, "spike_loss": float(s.last_loss),
                 "spike_window_mean": float(s.last_mean), "spike_window_std": float(s.last_std),
                 "spike_grad_jump": jump_L}
    if jax.process_index() == 0:  # through the bar, which would otherwise run into the line
        run.bar.write(f"warning: {new} loss spike(s) skipped (optim.skip_spikes={run.cfg.optim.skip_spikes}), "
              f"{run.spikes_seen} so far; the latest at step {run.spike['spike_step']}: loss "
              f"{run.spike['spike_loss']:.4f} against {run.spike['spike_window_mean']:.4f} +- "
              f"{run.spike['spike_window_std']:.4f}; block gradient norms jumped most in "
              + ", ".join(f"block {l + 1} (x{jump_L[l]:.3g})" for l in top), file=sys.stderr)


def sync(run: Run, step: int) -> None:
    """Waits for the devices; raises TrainingError at the first non-finite loss since the last
    wait (unless optim.skip_nonfinite) or when too many updates in a row were skipped."""
    new_losses = [float(v) for v in jax.device_get(run.pending_losses)]
    run.pending_losses.clear()
    run.metrics.step_losses += new_losses
    report_spikes(run)
    o = run.cfg.optim
    if not o.skip_nonfinite:
        bad = next((i for i, v in enumerate(new_losses) if not math.isfinite(v)), None)
        if bad is not None:
            raise TrainingError(f"non-finite loss {new_losses[bad]} at step {step - len(new_losses) + 1 + bad}; "
                                f"{run.where} (optim.skip_nonfinite=true skips such updates)")
        return
    counts = jax.device_get(optim.skip_counts(run.state.opt_state))
    in_a_row = int(counts["skipped_in_a_row"])
    if in_a_row >= o.max_consecutive_skips:
        raise TrainingError(f"the last {in_a_row} updates (steps {step - in_a_row + 1}-{step}) had non-finite "
                            f"gradients and were skipped (optim.max_consecutive_skips={o.max_consecutive_skips}): "
                            f"the run is stuck; {run.where}")
    run.skipped = int(counts["skipped_updates"])


def save_checkpoint(run: Run, step: int) -> None:
    if not bool(_all_finite(run.state.params)):  # a finite loss, then an overflowing update
        raise TrainingError(f"the parameters after step {step} are not finite; {run.where}")
    checkpoint.save(run.ckpt, step, run.state, pipeline.get_state(run.batches, run.cfg, run.corpus),
                    run.metrics.step_losses)


def start_line(run: Run, step: int) -> None:
    run.line = metric_line(step, run.step_metrics)
    tokens = run.cfg.train.batch_size * run.cfg.model.seq_len * (step - run.last_step)
    run.line["tokens_per_sec"] = tokens / (time.perf_counter() - run.last_time)
    if run.peak_flops:
        run.line["mfu"] = mfu.mfu(run.line["tokens_per_sec"], run.flops_per_token, run.peak_flops, jax.device_count())
    if run.skipped is not None:
        run.line["skipped_updates"] = run.skipped
    if run.spike is not None:
        run.line |= run.spike
        run.spike = None


def validate(run: Run, step: int) -> None:
    if run.val:
        run.line |= steps.evaluate(run.eval_step, run.state.params, run.state.step, run.val, run.bytes_per_token_V)
        run.bar.write(f"step {step}: loss {run.line['loss']:.4f}  val_loss {run.line['val_loss']:.4f}")
        if run.knockout_step is not None:
            run.line["knockout"] = steps.knockout(run.knockout_step, run.state.params, run.state.step, run.val,
                                                  run.line["val_loss"])
    if run.tasks:
        run.line |= score_tasks(run, step)
    g = run.cfg.diagnostics
    run.line["spike_score"] = diagnostics.spike_score(run.metrics.step_losses, g.spike_window, g.spike_sigmas)


def score_tasks(run: Run, step: int) -> dict:
    """train.eval_tasks on the current parameters, scored by the code of `evaluate --task` (the
    same numbers as on this step's checkpoint): {task/NAME/METRIC: value}."""
    from andrea_jax.serve import load, tasks as tasks_lib
    loaded = load.LoadedModel(run.cfg, run.state.params, run.corpus.tokenizer, step, str(run.run_dir.root))
    line = {}
    for name, examples in run.tasks.items():
        metrics = tasks_lib.score_task(loaded, examples)
        line |= {f"task/{name}/{k}": float(v) for k, v in metrics.items() if k not in ("kind", "n")}
    return line


def write_line(run: Run, step: int) -> None:
    run.log.append(run.line)
    run.metrics.write(run.line)
    run.bar.set_postfix({k: f"{run.line[k]:.3g}" for k in ("loss", "val_loss", "tokens_per_sec") if k in run.line})
    run.bar.update(step - run.bar.n)
    run.last_time, run.last_step = time.perf_counter(), step


# (what must be due, hook), run in this order at a step where something is due.
HOOKS = (("checkpoint", save_checkpoint), ("log", start_line), ("eval", validate), ("log", write_line))


def run_due(run: Run, step: int, names: set[str], signum: int) -> None:
    """Runs what `names` asks of this step; on a signal, checkpoints and raises Stopped after the
    step's line (which an uninterrupted run writes too)."""
    if signum and run.ckpt is not None:
        names = names | {"checkpoint"}
    if not (names & SYNC or signum):
        return
    sync(run, step)
    for name, hook in HOOKS:
        if name in names:
            hook(run, step)
    if signum:
        raise preemption.Stopped(signum, step, run.saved_at(step))


def close(run: Run) -> None:
    """At the end, however the loop ended: the losses up to a failed step are kept too."""
    run.bar.close()
    run.metrics.step_losses += [float(v) for v in jax.device_get(run.pending_losses)]
    run.metrics.close()
    if run.ckpt is not None:
        run.ckpt.wait_until_finished()  # train() closes it


def warn_unreadable(restored, ckpt) -> None:
    if restored.unreadable and jax.process_index() == 0:
        print(f"warning: {'; '.join(restored.unreadable)}: cannot be restored, left in place; resuming "
              f"from {ckpt.directory}/{restored.step}", file=sys.stderr, flush=True)
