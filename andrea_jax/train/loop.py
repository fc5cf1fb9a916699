"""The training loop: set up (mesh, data, state, resume), then step and let the hooks of
andrea_jax.train.hooks do what each step owes (checkpoint, log, evaluation, diagnostics, stop on
a signal). The only module that knows about time.
"""
from __future__ import annotations

import contextlib
import json
import pathlib
import sys
from typing import Callable

import jax
from jax.sharding import NamedSharding, PartitionSpec as P
from tqdm import tqdm

from andrea_jax import model as model_lib
from andrea_jax.config import Config, ConfigError
from andrea_jax.data import pipeline, tokenizer as tokenizer_lib
from andrea_jax.train import checkpoint, hooks, mfu, optim, preemption, profiling
from andrea_jax.train.metrics import MetricsLog, import_wandb
from andrea_jax.train.sharding import batch_devices, batch_spec
from andrea_jax.train.steps import (create_state, make_eval_step, make_knockout_step, make_mesh,
                                    make_train_step)
from andrea_jax.workdir import Workdir

# at_end(cfg, run_dir, state, tokenizer, has_checkpoint=...): called on every process after the
# last step, under the mesh (the command line passes the closing sample of andrea_jax.serve.generate)
AtEnd = Callable[..., None]


def train(cfg: Config, workdir: str | pathlib.Path, *, show_progress: bool = True,
          allow_schedule_change: bool = False, at_end: AtEnd | None = None) -> list[dict]:
    """Trains, resuming from the newest readable checkpoint in workdir if there is one; returns
    the metric lines logged by this call (all of them are in workdir/metrics.jsonl).

    Raises preemption.Stopped, after checkpointing, when SIGTERM or SIGINT stops the run;
    WorkdirBusy while another run trains in workdir; ResumeError when its checkpoints come from
    other settings (`allow_schedule_change` accepts another train.steps or optimizer schedule,
    which re-stretches the LR schedule)."""
    run_dir = Workdir(workdir).create()
    with run_dir.held(), (checkpoint.manager(run_dir.root, max_to_keep=cfg.train.keep_checkpoints)
                          if cfg.train.checkpoint_every else contextlib.nullcontext()) as ckpt:
        return _train(cfg, run_dir, ckpt, show_progress, allow_schedule_change, at_end)


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


def _read_tasks(cfg: Config) -> dict:
    """train.eval_tasks: {file stem: examples}, read and checked as `evaluate --task` reads them."""
    paths = [p.strip() for p in cfg.train.eval_tasks.split(",") if p.strip()]
    if not paths:
        return {}
    from andrea_jax.serve import tasks as tasks_lib
    read = {pathlib.Path(p).stem: tasks_lib.read_task(p) for p in paths}
    if len(read) < len(paths):
        raise ConfigError(f"train.eval_tasks: two files share a name ({cfg.train.eval_tasks}); their metrics "
                          f"are logged as task/NAME/...")
    return read


def _train(cfg: Config, run_dir: Workdir, ckpt, show_progress: bool, allow_schedule_change: bool,
           at_end: AtEnd | None) -> list[dict]:
    profiling.use_compile_cache(cfg.train.compile_cache)  # before the first compile
    mesh = make_mesh(cfg)  # refuses (ConfigError) a mesh that misses the devices, heads, MLP width or batch
    resuming = ckpt is not None and ckpt.latest_step() is not None
    if resuming:  # before tokenizing: a refusal comes at once
        run_dir.check_resume(cfg, allow_schedule_change=allow_schedule_change)
    init_params = None
    if cfg.train.init_from and not resuming:  # read before tokenizing too: a folder that does not fit fails at once
        from andrea_jax.serve import hf_import
        init_params = hf_import.read_params(cfg, cfg.train.init_from)
    tasks = _read_tasks(cfg)  # before tokenizing: a bad task file fails at once
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

    train_step = make_train_step(cfg, mesh)
    diag_step = make_train_step(cfg, mesh, with_diagnostics=True) if cfg.diagnostics.every else None
    run = hooks.Run(
        cfg, run_dir, ckpt, batches, corpus, _validation(cfg, mesh, val, to_global), make_eval_step(cfg, mesh),
        jax.device_put(tokenizer_lib.bytes_per_token(corpus.tokenizer), NamedSharding(mesh, P())),
        MetricsLog(cfg, run_dir, start, step_losses),
        tqdm(total=cfg.train.steps, initial=start, disable=not show_progress or jax.process_index() != 0,
             dynamic_ncols=True),
        state, start, last_step=start)
    run.flops_per_token = mfu.model_flops_per_token(cfg.model)
    run.peak_flops = cfg.train.peak_tflops * 1e12 or mfu.peak_flops(jax.devices()[0].device_kind)
    if cfg.diagnostics.knockout:
        run.knockout_step = make_knockout_step(cfg, mesh)
    run.tasks = tasks
    if (spikes := optim.spike_state(state.opt_state)) is not None:  # a resumed run's are reported already
        run.spikes_seen = int(jax.device_get(spikes.skipped))
    stop = preemption.StopRequests().install()  # uninstalled in the finally below
    # Printed once signals are caught: from here on SIGTERM / SIGINT stop the run with a checkpoint.
    print(f"ANDREA: {sum(int(p.size) for p in jax.tree.leaves(state.params)):,} parameters, "
          f"{corpus.train_size}, {jax.device_count()} {jax.devices()[0].platform} device(s) in "
          f"{jax.process_count()} process(es), ProRes {cfg.prores.schedule} T={cfg.prores.warmup}, attention: "
          f"{model_lib.attention_impl(cfg.model)[1]}" + (f", resumed at step {start}" if start else ""), flush=True)
    # The mesh is current while steps are traced, so the kernels see which axes split the rows.
    trace = profiling.StepTrace(cfg.train.profile, run_dir.root / "profile")
    with jax.set_mesh(mesh):
        try:
            for step in range(start + 1, cfg.train.steps + 1):
                due = hooks.due(cfg, step, has_checkpoints=ckpt is not None)
                step_fn = diag_step if "diagnostics" in due else train_step
                trace.before(step)
                run.state, run.step_metrics = step_fn(run.state, to_global(next(batches)))
                trace.after(step, run.state)
                run.pending_losses.append(run.step_metrics["loss"])
                hooks.run_due(run, step, due, stop.agreed(at_sync_point=bool(due & hooks.SYNC)))
        finally:
            trace.close()
            stop.uninstall()
            hooks.close(run)
        if at_end is not None:
            at_end(cfg, run_dir, run.state, corpus.tokenizer, has_checkpoint=ckpt is not None)
    return run.log
