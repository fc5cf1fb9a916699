"""The training loop: set up (mesh, data, state, resume: `_set_up`), build the hooks' Context
(`context`), then step (`_steps`). What a step owes besides training (checkpoint, its metric
line, evaluation, stop on a signal) is the list of `step_hooks`, each with its rule, run in that
order (`run_hooks`); the hook functions are in andrea_jax.train.hooks. Around them the loop waits
for the devices (`sync`), writes the line and closes the run's sinks.

`sync` is the host's wait for the devices: there it checks the loss of every step since the
last wait, so a non-finite loss is reported at its own step and before any checkpoint could
hold its update.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import pathlib
import sys
import time
import types
from typing import Callable, NamedTuple, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tqdm import tqdm

from andrea_jax import checkpoint, model as model_lib, ramps, startup
from andrea_jax.config import Config
from andrea_jax.data import pipeline, tokenizer as tokenizer_lib
from andrea_jax.errors import ConfigError, TrainingError
from andrea_jax.model import hf
from andrea_jax.train import hooks, mfu, optim, preemption, profiling
from andrea_jax.train.metrics import MetricsLog, import_wandb
from andrea_jax.train.sharding import batch_devices, batch_spec
from andrea_jax.train.steps import (create_state, make_eval_step, make_knockout_step, make_mesh,
                                    make_train_step)
from andrea_jax.workdir import Workdir

# at_end(cfg, run_dir, state, tokenizer, has_checkpoint=...): called on every process after the
# last step, under the mesh (the command line passes the closing sample of andrea_jax.serve.generate)
AtEnd = Callable[..., None]


def train(cfg: Config, workdir: str | pathlib.Path, *, show_progress: bool = True,
          allow_schedule_change: bool = False, at_end: AtEnd | None = None,
          extra_hooks: Sequence[hooks.Hook] = ()) -> list[dict]:
    """Trains, resuming from the newest readable checkpoint in workdir if there is one; returns
    the metric lines logged by this call (all of them are in workdir/metrics.jsonl).

    Raises preemption.Stopped, after checkpointing, when SIGTERM or SIGINT stops the run;
    WorkdirBusy while another run trains in workdir; ResumeError when its checkpoints come from
    other settings (`allow_schedule_change` accepts another train.steps or optimizer schedule,
    which re-stretches the LR schedule). `extra_hooks` run at the steps their rules name, after
    the evaluation (the command line passes train.eval_tasks' scoring, andrea_jax.serve.tasks)."""
    check_deterministic(cfg)
    run_dir = Workdir(workdir).create()
    with run_dir.held(), (checkpoint.manager(run_dir.root, max_to_keep=cfg.train.keep_checkpoints)
                          if cfg.train.checkpoint_every else contextlib.nullcontext()) as ckpt:
        return _train(cfg, run_dir, ckpt, show_progress, allow_schedule_change, at_end, extra_hooks)


def check_deterministic(cfg: Config) -> None:
    """ConfigError when train.deterministic is asked for and XLA_FLAGS lacks its flags."""
    if cfg.train.deterministic and not startup.has_deterministic_flags(os.environ.get("XLA_FLAGS", "")):
        raise ConfigError("train.deterministic=true: XLA_FLAGS lacks " + " ".join(
            f"--{k}={v}" for k, v in startup.DETERMINISTIC_XLA_FLAGS.items()) + ", which must be set before jax "
            "starts (train.py sets them; a program calling train() sets them before it imports jax)")


def _validation(cfg: Config, mesh, val, to_global) -> list:
    """The validation batches as global arrays; a batch the devices cannot split is left out, saying so."""
    kept = [to_global(b) for b in val if len(b) * jax.process_count() % batch_devices(cfg, mesh) == 0]
    if len(kept) < len(val) and jax.process_index() == 0:
        print(f"warning: {len(val) - len(kept)} of {len(val)} validation batches are not divisible by the "
              f"{batch_devices(cfg, mesh)} devices that split the batch and are left out", file=sys.stderr)
    return kept


def _placed(host, params_like):
    """Host arrays (train.init_from's weights) in the shardings of the fresh parameters they
    replace, each process's shards cut from the whole tensor it read."""
    return jax.tree.map(lambda a, like: jax.make_array_from_callback(a.shape, like.sharding, lambda idx: a[idx]),
                        host, params_like)


def _is_every(n: int) -> Callable[[int], bool]:
    return lambda step: bool(n) and step % n == 0


def at_eval(cfg: Config) -> Callable[[int], bool]:
    """Whether a step evaluates: every train.eval_every steps (with a ramp: each time the tokens seen
    pass a multiple of that many full-shape steps' tokens, andrea_jax.ramps.crosses) and at the last."""
    return lambda step: ramps.crosses(cfg, step, cfg.train.eval_every) or step == cfg.train.steps


def at_diagnostics(cfg: Config) -> Callable[[int], bool]:
    """Whether a step runs the train step with diagnostics: every diagnostics.every steps and at step 1."""
    return lambda step: bool(cfg.diagnostics.every) and (_is_every(cfg.diagnostics.every)(step) or step == 1)


def step_hooks(cfg: Config, *, has_checkpoints: bool, extra: Sequence[hooks.Hook] = ()) -> list[hooks.Hook]:
    """What a step may owe, in the order it is done: a checkpoint (every train.checkpoint_every,
    counted like train.eval_every in `at_eval`, at the last step and when a signal stops the run),
    the step's line (every train.log_every, and whenever it evaluates or ran diagnostics: the steps
    whose line is written), the evaluation (every train.eval_every and at the last), then `extra`
    (such as train.eval_tasks, at the evaluation's steps) and the spike score."""
    last = lambda step: step == cfg.train.steps
    evaluates, diagnoses = at_eval(cfg), at_diagnostics(cfg)
    saves = lambda step: ramps.crosses(cfg, step, cfg.train.checkpoint_every) or last(step)
    checkpoints = [hooks.Hook("checkpoint", saves, hooks.save_checkpoint, on_stop=True)] if has_checkpoints else []
    return [*checkpoints,
            hooks.Hook("log", lambda step: _is_every(cfg.train.log_every)(step) or evaluates(step) or diagnoses(step),
                       hooks.step_line, writes_line=True),
            hooks.Hook("eval", evaluates, hooks.validate),
            *extra,
            hooks.Hook("spike_score", evaluates, hooks.spike_score)]


class Run(NamedTuple):
    """What set-up made ready for the steps: the workdir and its checkpoints, the mesh, the data,
    and the train state with the step it starts after and every step's loss up to there."""
    dir: Workdir
    ckpt: object                  # orbax CheckpointManager; None with train.checkpoint_every=0
    mesh: Mesh
    corpus: pipeline.TokenizedCorpus
    batches: object               # the data iterator, at the position of `start`
    val: list                     # this process's validation batches
    to_global: Callable           # this process's rows -> a global batch
    eot: int                      # where data.document_mask cuts a row into documents
    state: object                 # the train state
    start: int
    step_losses: list


def _set_up(cfg: Config, run_dir: Workdir, ckpt, allow_schedule_change: bool) -> Run:
    """The mesh, the data and the train state: fresh, from train.init_from, or resumed from the
    newest readable checkpoint; settings that cannot work are refused before the data is tokenized."""
    profiling.use_compile_cache(cfg.train.compile_cache)  # before the first compile
    mesh = make_mesh(cfg)  # refuses (ConfigError) a mesh that misses the devices, heads, MLP width or batch
    resuming = ckpt is not None and ckpt.latest_step() is not None
    if resuming:  # before tokenizing: a refusal comes at once
        run_dir.check_resume(cfg, allow_schedule_change=allow_schedule_change)
    init_params = None
    if cfg.train.init_from and not resuming:  # read before tokenizing too: a folder that does not fit fails at once
        init_params = hf.read_params(cfg, cfg.train.init_from)
    if cfg.diagnostics.wandb:
        import_wandb()  # and a missing wandb package too
    corpus, batches, val = pipeline.build(cfg, run_dir.root)  # also saves the run's tokenizer.json
    batch_sharding = NamedSharding(mesh, batch_spec(cfg, mesh))
    to_global = lambda local: jax.make_array_from_process_local_data(batch_sharding, local)
    state, start, step_losses = create_state(cfg, jax.random.key(cfg.train.seed), mesh), 0, []
    if ckpt is not None and (restored := checkpoint.restore_newest_readable(ckpt, state)) is not None:
        _warn_unreadable(restored, ckpt)
        pipeline.set_state(batches, cfg, corpus, restored.data_state,
                           where=f"the data state of checkpoint {ckpt.directory}/{restored.step}")
        state, start, step_losses = restored.state, restored.step, restored.step_losses
    elif init_params is not None:
        state = state.replace(params=_placed(init_params, state.params))
    if jax.process_index() == 0:
        run_dir.config.write_text(json.dumps(cfg.to_dict(), indent=2))
    return Run(run_dir, ckpt, mesh, corpus, batches, val, to_global, tokenizer_lib.eot_id(corpus.tokenizer),
               state, start, step_losses)


def context(cfg: Config, run: Run, *, show_progress: bool = True) -> hooks.Context:
    """The hooks' Context of a run: its global validation batches, compiled evaluation steps,
    metrics log (from the run's start) and progress bar."""
    return hooks.Context(
        cfg=cfg, run_dir=run.dir, ckpt=run.ckpt, batches=run.batches, corpus=run.corpus,
        val=_validation(cfg, run.mesh, run.val, run.to_global), eval_step=make_eval_step(cfg, run.mesh, run.eot),
        bytes_per_token_V=jax.device_put(tokenizer_lib.bytes_per_token(run.corpus.tokenizer),
                                         NamedSharding(run.mesh, P())),
        metrics=MetricsLog(cfg, run.dir, run.start, run.step_losses),
        bar=tqdm(total=cfg.train.steps, initial=run.start,
                 disable=not show_progress or jax.process_index() != 0, dynamic_ncols=True),
        knockout_step=make_knockout_step(cfg, run.mesh, run.eot) if cfg.diagnostics.knockout else None,
        flops_per_token=mfu.model_flops_per_token(cfg.model),
        peak_flops=cfg.train.peak_tflops * 1e12 or mfu.peak_flops(jax.devices()[0].device_kind))


def _train(cfg: Config, run_dir: Workdir, ckpt, show_progress: bool, allow_schedule_change: bool,
           at_end: AtEnd | None, extra_hooks: Sequence[hooks.Hook]) -> list[dict]:
    run = _set_up(cfg, run_dir, ckpt, allow_schedule_change)
    ctx = context(cfg, run, show_progress=show_progress)
    loop_state = hooks.LoopState(run.state, last_step=run.start,  # a resumed run's spikes are reported already
                                 spikes_seen=hooks.latest_spike(run.state.opt_state)[0])
    train_step = make_train_step(cfg, run.mesh, eot_id=run.eot)
    diag_step = make_train_step(cfg, run.mesh, with_diagnostics=True, eot_id=run.eot) if cfg.diagnostics.every else None
    stop = preemption.StopRequests().install()  # uninstalled in the finally below
    # Printed once signals are caught: from here on SIGTERM / SIGINT stop the run with a checkpoint.
    print(f"ANDREA: {sum(int(p.size) for p in jax.tree.leaves(run.state.params)):,} parameters, "
          f"{run.corpus.train_size}, {jax.device_count()} {jax.devices()[0].platform} device(s) in "
          f"{jax.process_count()} process(es), ProRes {cfg.prores.schedule} T={_prores_t(cfg)}, attention: "
          f"{model_lib.attention_impl(cfg.model)[1]}" + (f", resumed at step {run.start}" if run.start else ""),
          flush=True)
    if ramps.ramped(cfg):
        print(ramps.describe(cfg), flush=True)
    # The mesh is current while steps are traced, so the kernels see which axes split the rows.
    with jax.set_mesh(run.mesh):
        try:
            _steps(ctx, loop_state, (train_step, diag_step), run.to_global, stop,
                   step_hooks(cfg, has_checkpoints=ckpt is not None, extra=extra_hooks))
        finally:
            stop.uninstall()
            _close(ctx, loop_state)
        if at_end is not None:
            at_end(cfg, run_dir, loop_state.train, run.corpus.tokenizer, has_checkpoint=ckpt is not None)
    return loop_state.lines


def _prores_t(cfg: Config) -> str:
    return f"{cfg.prores.warmup_tokens:,} tokens" if cfg.prores.warmup_tokens else str(cfg.prores.warmup)


def run_hooks(ctx: hooks.Context, state: hooks.LoopState, step: int, due: Sequence[hooks.Hook]) -> dict:
    """Runs the due hooks in order, each given what those before it returned (read-only), and
    returns all they returned merged: the step's line."""
    line = {}
    for hook in due:
        line |= hook.fn(ctx, state, step, types.MappingProxyType(line))
    return line


def _steps(ctx: hooks.Context, state: hooks.LoopState, step_fns, to_global, stop: preemption.StopRequests,
           step_hooks: list[hooks.Hook]) -> None:
    """Steps train.steps: each step trains on the next batch, then, when something is due, the
    host waits for the devices (`sync` raises at a non-finite loss, before any checkpoint), the
    due hooks run in order, their metrics merged into one line, which is written when a hook that
    `writes_line` is due; a signal adds the `on_stop` hooks (the checkpoint) and stops the run
    (preemption.Stopped) after the line."""
    cfg, diagnoses = ctx.cfg, at_diagnostics(ctx.cfg)
    train_step, diag_step = step_fns
    trace = profiling.StepTrace(cfg.train.profile, ctx.run_dir.root / "profile")
    try:
        for step in range(state.last_step + 1, cfg.train.steps + 1):
            due = [hook for hook in step_hooks if hook.due(step)]
            trace.before(step)
            step_fn = diag_step if diagnoses(step) else train_step
            state.train, state.step_metrics = step_fn(state.train, to_global(next(ctx.batches)))
            trace.after(step, state.train)
            state.pending_losses.append(state.step_metrics["loss"])
            signum = stop.agreed(at_sync_point=bool(due))  # processes agree only where the host waits
            if signum:
                due = [hook for hook in step_hooks if hook in due or hook.on_stop]
            if not (due or signum):
                continue
            sync(ctx, state, step)
            line = run_hooks(ctx, state, step, due)
            if any(hook.writes_line for hook in due):
                _write_line(ctx, state, step, line)
            if signum:
                raise preemption.Stopped(signum, step, ctx.saved_at(step))
    finally:
        trace.close()


def _report_spikes(ctx: hooks.Context, state: hooks.LoopState) -> None:
    """optim.skip_spikes: says on stderr how many loss spikes were skipped since the last wait and
    which blocks' gradient norms jumped most (over their window means) at the latest."""
    seen, spike = hooks.latest_spike(state.train.opt_state)
    new = seen - state.spikes_seen
    if new <= 0:
        return
    state.spikes_seen = seen
    jump_L = spike["spike_grad_jump"]
    top = sorted(range(len(jump_L)), key=lambda l: -jump_L[l])[:3]
    if jax.process_index() == 0:  # through the bar, which would otherwise run into the line
        ctx.bar.write(f"warning: {new} loss spike(s) skipped (optim.skip_spikes={ctx.cfg.optim.skip_spikes}), "
                      f"{seen} so far; the latest at step {spike['spike_step']}: loss "
                      f"{spike['spike_loss']:.4f} against {spike['spike_window_mean']:.4f} +- "
                      f"{spike['spike_window_std']:.4f}; block gradient norms jumped most in "
                      + ", ".join(f"block {l + 1} (x{jump_L[l]:.3g})" for l in top), file=sys.stderr)


def sync(ctx: hooks.Context, state: hooks.LoopState, step: int) -> None:
    """Waits for the devices; raises TrainingError at the first non-finite loss since the last
    wait (unless optim.skip_nonfinite) or when too many updates in a row were skipped."""
    new_losses = [float(v) for v in jax.device_get(state.pending_losses)]
    state.pending_losses.clear()
    ctx.metrics.step_losses += new_losses
    _report_spikes(ctx, state)
    o = ctx.cfg.optim
    if not o.skip_nonfinite:
        bad = next((i for i, v in enumerate(new_losses) if not math.isfinite(v)), None)
        if bad is not None:
            raise TrainingError(f"non-finite loss {new_losses[bad]} at step {step - len(new_losses) + 1 + bad}; "
                                f"{ctx.where} (optim.skip_nonfinite=true skips such updates)")
        return
    in_a_row = int(jax.device_get(optim.skip_counts(state.train.opt_state)["skipped_in_a_row"]))
    if in_a_row >= o.max_consecutive_skips:
        raise TrainingError(f"the last {in_a_row} updates (steps {step - in_a_row + 1}-{step}) had non-finite "
                            f"gradients and were skipped (optim.max_consecutive_skips={o.max_consecutive_skips}): "
                            f"the run is stuck; {ctx.where}")


def _write_line(ctx: hooks.Context, state: hooks.LoopState, step: int, line: dict) -> None:
    state.lines.append(line)
    ctx.metrics.write(line)
    ctx.bar.set_postfix({k: f"{line[k]:.3g}" for k in ("loss", "val_loss", "tokens_per_sec") if k in line})
    ctx.bar.update(step - ctx.bar.n)
    state.last_time, state.last_step = time.perf_counter(), step


def _close(ctx: hooks.Context, state: hooks.LoopState) -> None:
    """At the end, however the loop ended: the losses up to a failed step are kept too."""
    ctx.bar.close()
    ctx.metrics.step_losses += [float(v) for v in jax.device_get(state.pending_losses)]
    ctx.metrics.close()
    if ctx.ckpt is not None:
        ctx.ckpt.wait_until_finished()  # train() closes it


def _warn_unreadable(restored, ckpt) -> None:
    if restored.unreadable and jax.process_index() == 0:
        print(f"warning: {'; '.join(restored.unreadable)}: cannot be restored, left in place; resuming "
              f"from {ckpt.directory}/{restored.step}", file=sys.stderr, flush=True)
