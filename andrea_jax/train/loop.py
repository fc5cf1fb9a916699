"""The training loop: set up (mesh, data, state, resume), then step (`_steps`); what a step owes
besides training (checkpoint, its metric line, evaluation, stop on a signal) is the list of
`step_hooks`, each with its rule, run in that order; the hook functions are in
andrea_jax.train.hooks.
"""
from __future__ import annotations

import contextlib
import json
import pathlib
import sys
from typing import Callable, Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec as P
from tqdm import tqdm

from andrea_jax import checkpoint, model as model_lib
from andrea_jax.config import Config
from andrea_jax.data import pipeline, tokenizer as tokenizer_lib
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
    run_dir = Workdir(workdir).create()
    with run_dir.held(), (checkpoint.manager(run_dir.root, max_to_keep=cfg.train.keep_checkpoints)
                          if cfg.train.checkpoint_every else contextlib.nullcontext()) as ckpt:
        return _train(cfg, run_dir, ckpt, show_progress, allow_schedule_change, at_end, extra_hooks)


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
    """Whether a step evaluates: every train.eval_every steps and at the last."""
    return lambda step: _is_every(cfg.train.eval_every)(step) or step == cfg.train.steps


def at_diagnostics(cfg: Config) -> Callable[[int], bool]:
    """Whether a step runs the train step with diagnostics: every diagnostics.every steps and at step 1."""
    return lambda step: bool(cfg.diagnostics.every) and (_is_every(cfg.diagnostics.every)(step) or step == 1)


def step_hooks(cfg: Config, *, has_checkpoints: bool, extra: Sequence[hooks.Hook] = ()) -> list[hooks.Hook]:
    """What a step may owe, in the order it is done: a checkpoint (every train.checkpoint_every
    and at the last step), the step's line (every train.log_every, and whenever it evaluates or
    ran diagnostics), the evaluation (every train.eval_every and at the last), then `extra` (such
    as train.eval_tasks, at the evaluation's steps) and the spike score."""
    last = lambda step: step == cfg.train.steps
    evaluates, diagnoses = at_eval(cfg), at_diagnostics(cfg)
    checkpoints = [hooks.Hook("checkpoint", lambda step: _is_every(cfg.train.checkpoint_every)(step) or last(step),
                              hooks.save_checkpoint)] if has_checkpoints else []
    return [*checkpoints,
            hooks.Hook("log", lambda step: _is_every(cfg.train.log_every)(step) or evaluates(step) or diagnoses(step),
                       hooks.step_line),
            hooks.Hook("eval", evaluates, hooks.validate),
            *extra,
            hooks.Hook("spike_score", evaluates, hooks.spike_score)]


def _train(cfg: Config, run_dir: Workdir, ckpt, show_progress: bool, allow_schedule_change: bool,
           at_end: AtEnd | None, extra_hooks: Sequence[hooks.Hook]) -> list[dict]:
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
        hooks.warn_unreadable(restored, ckpt)
        pipeline.set_state(batches, cfg, corpus, restored.data_state,
                           where=f"the data state of checkpoint {ckpt.directory}/{restored.step}")
        state, start, step_losses = restored.state, restored.step, restored.step_losses
    elif init_params is not None:
        state = state.replace(params=_placed(init_params, state.params))
    if jax.process_index() == 0:
        run_dir.config.write_text(json.dumps(cfg.to_dict(), indent=2))

    eot = tokenizer_lib.eot_id(corpus.tokenizer)  # where data.document_mask cuts a row into documents
    ctx = hooks.Context(
        cfg, run_dir, ckpt, batches, corpus, _validation(cfg, mesh, val, to_global), make_eval_step(cfg, mesh, eot),
        jax.device_put(tokenizer_lib.bytes_per_token(corpus.tokenizer), NamedSharding(mesh, P())),
        MetricsLog(cfg, run_dir, start, step_losses),
        tqdm(total=cfg.train.steps, initial=start, disable=not show_progress or jax.process_index() != 0,
             dynamic_ncols=True),
        knockout_step=make_knockout_step(cfg, mesh, eot) if cfg.diagnostics.knockout else None,
        flops_per_token=mfu.model_flops_per_token(cfg.model),
        peak_flops=cfg.train.peak_tflops * 1e12 or mfu.peak_flops(jax.devices()[0].device_kind))
    loop_state = hooks.LoopState(state, last_step=start)
    if (spikes := optim.spike_state(state.opt_state)) is not None:  # a resumed run's are reported already
        loop_state.spikes_seen = int(jax.device_get(spikes.skipped))
    step_fns = (make_train_step(cfg, mesh, eot_id=eot),
                make_train_step(cfg, mesh, with_diagnostics=True, eot_id=eot) if cfg.diagnostics.every else None)
    stop = preemption.StopRequests().install()  # uninstalled in the finally below
    # Printed once signals are caught: from here on SIGTERM / SIGINT stop the run with a checkpoint.
    print(f"ANDREA: {sum(int(p.size) for p in jax.tree.leaves(state.params)):,} parameters, "
          f"{corpus.train_size}, {jax.device_count()} {jax.devices()[0].platform} device(s) in "
          f"{jax.process_count()} process(es), ProRes {cfg.prores.schedule} T={cfg.prores.warmup}, attention: "
          f"{model_lib.attention_impl(cfg.model)[1]}" + (f", resumed at step {start}" if start else ""), flush=True)
    # The mesh is current while steps are traced, so the kernels see which axes split the rows.
    with jax.set_mesh(mesh):
        try:
            _steps(ctx, loop_state, step_fns, to_global, stop,
                   step_hooks(cfg, has_checkpoints=ckpt is not None, extra=extra_hooks))
        finally:
            stop.uninstall()
            hooks.close(ctx, loop_state)
        if at_end is not None:
            at_end(cfg, run_dir, loop_state.train, corpus.tokenizer, has_checkpoint=ckpt is not None)
    return loop_state.lines


def _steps(ctx: hooks.Context, state: hooks.LoopState, step_fns, to_global, stop: preemption.StopRequests,
           step_hooks: list[hooks.Hook]) -> None:
    """Steps train.steps: each step trains on the next batch, then, when something is due, the
    host waits for the devices (`sync` raises at a non-finite loss, before any checkpoint), the
    due hooks run in order, their metrics merged into one line, which is written when `log` is
    due; a signal adds the checkpoint and stops the run (preemption.Stopped) after the line."""
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
                due = [hook for hook in step_hooks if hook in due or hook.name == "checkpoint"]
            if not (due or signum):
                continue
            hooks.sync(ctx, state, step)
            line = {}
            for hook in due:
                line |= hook.fn(ctx, state, step)
            if any(hook.name == "log" for hook in due):
                hooks.write_line(ctx, state, step, line)
            if signum:
                raise preemption.Stopped(signum, step, ctx.saved_at(step))
    finally:
        trace.close()
