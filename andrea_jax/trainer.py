"""The training loop: data, the jitted steps of andrea_jax.steps, evaluation, logging, checkpoints,
resuming and stopping on a signal. The only module that knows about time.

The host waits for the devices only at log and checkpoint steps (and at a stop). There it checks
the loss of every step since the last wait, so a non-finite loss is reported at its own step and
before any checkpoint could hold its update.
"""
from __future__ import annotations

import contextlib
import json
import math
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P
from tqdm import tqdm

from andrea_jax import (checkpoint, model as model_lib, diagnostics as diag_lib, generate, inference, optim, preemption, resume,
                        run_lock)
from andrea_jax.config import Config, ConfigError
from andrea_jax.data import pipeline, tokenizer as tokenizer_lib
from andrea_jax.steps import create_state, evaluate, make_eval_step, make_mesh, make_train_step
from andrea_jax.sharding import batch_devices, batch_spec


class TrainingError(RuntimeError):
    """Training cannot go on (a non-finite loss): the message says at which step."""


@jax.jit
def _all_finite(tree):
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def _check_losses(losses: list[float], first_step: int, cfg: Config, where: str) -> None:
    """Raises TrainingError at the first non-finite loss of steps first_step.. (unless skipped)."""
    if cfg.optim.skip_nonfinite:
        return
    bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    if bad is not None:
        raise TrainingError(f"non-finite loss {losses[bad]} at step {first_step + bad}; {where} "
                            f"(optim.skip_nonfinite=true skips such updates)")


def _check_skips(state, step: int, cfg: Config, where: str) -> int:
    """The number of updates skipped so far; raises TrainingError when the run is stuck."""
    counts = jax.device_get(optim.skip_counts(state.opt_state))
    in_a_row = int(counts["skipped_in_a_row"])
    if in_a_row >= cfg.optim.max_consecutive_skips:
        raise TrainingError(f"the last {in_a_row} updates (steps {step - in_a_row + 1}-{step}) had non-finite "
                            f"gradients and were skipped (optim.max_consecutive_skips="
                            f"{cfg.optim.max_consecutive_skips}): the run is stuck; {where}")
    return int(counts["skipped_updates"])


def _metric_line(step: int, metrics) -> dict:
    """Host values of one step's metrics: floats, and lists of floats for per-layer arrays."""
    host = jax.device_get(metrics)
    return {"step": step, **{k: float(v) if np.ndim(v) == 0 else [float(x) for x in np.ravel(v)]
                             for k, v in host.items()}}


def _tensorboard(cfg: Config, workdir: pathlib.Path):
    if not cfg.diagnostics.tensorboard or jax.process_index() != 0:
        return None
    from tensorboardX import SummaryWriter  # imported only when used: it is slow to import
    return SummaryWriter(str(workdir / "tb"))


def _write_tensorboard(writer, line: dict) -> None:
    """Scalars under their names; per-layer lists as NAME/layer_LLL (1-based) plus NAME/max."""
    step = line["step"]
    for key, value in line.items():
        if key == "step":
            continue
        if isinstance(value, list):
            for l, v in enumerate(value, start=1):
                writer.add_scalar(f"{key}/layer_{l:03d}", v, step)
            writer.add_scalar(f"{key}/max", max(value), step)
        else:
            writer.add_scalar(key, value, step)


class _MetricsLog:
    """metrics.jsonl, TensorBoard and the per-step losses, written by process 0 only.

    On a resumed run the lines and losses of steps after the restored checkpoint are dropped, so
    the files read as one uninterrupted run."""

    def __init__(self, cfg: Config, workdir: pathlib.Path, start_step: int, step_losses: list[float]):
        self.active = jax.process_index() == 0
        self.lines_path, self.losses_path = workdir / "metrics.jsonl", workdir / "step_losses.npy"
        kept, self.step_losses = [], list(step_losses)  # the restored checkpoint's: aligned with its step
        if start_step and self.active and self.lines_path.exists():
            kept = [l for l in self.lines_path.read_text().splitlines()
                    if l.strip() and json.loads(l)["step"] <= start_step]
        self.file = self.lines_path.open("w") if self.active else None
        if self.file:
            self.file.writelines(l + "\n" for l in kept)
        self.writer = _tensorboard(cfg, workdir)

    def write(self, line: dict) -> None:
        if self.file:
            self.file.write(json.dumps(line) + "\n")
            self.file.flush()
        if self.writer is not None:
            _write_tensorboard(self.writer, line)

    def close(self) -> None:
        if self.file:
            self.file.close()
            np.save(self.losses_path, np.asarray(self.step_losses, np.float32))
        if self.writer is not None:
            self.writer.close()


def _restore(cfg: Config, ckpt, state, batches, corpus):
    """(state, step, per-step losses) of the newest readable checkpoint, the data loader moved to
    match; (state, 0, []) when there is none."""
    restored = checkpoint.restore_newest_readable(ckpt, state)
    if restored is None:
        return state, 0, []
    if restored.unreadable and jax.process_index() == 0:
        print(f"warning: {'; '.join(restored.unreadable)}: cannot be restored, left in place; resuming "
              f"from {ckpt.directory}/{restored.step}", file=sys.stderr, flush=True)
    pipeline.set_state(batches, cfg, corpus, restored.data_state,
                       where=f"the data state of checkpoint {ckpt.directory}/{restored.step}")
    return restored.state, restored.step, restored.step_losses


def train(cfg: Config, workdir: str | pathlib.Path, *, show_progress: bool = True,
          allow_schedule_change: bool = False) -> list[dict]:
    """Trains, resuming from the newest readable checkpoint in workdir if there is one; returns
    the metric lines logged by this call (all of them are in workdir/metrics.jsonl).

    Raises preemption.Stopped, after checkpointing, when SIGTERM or SIGINT stops the run;
    run_lock.WorkdirBusy while another run trains in workdir; resume.ResumeError when its
    checkpoints come from other settings (`allow_schedule_change` accepts another train.steps or
    optimizer schedule, which re-stretches the LR schedule)."""
    workdir = pathlib.Path(workdir)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"workdir {workdir} is (or is inside) an existing file, not a folder") from None
    with run_lock.held(workdir), (checkpoint.manager(workdir, max_to_keep=cfg.train.keep_checkpoints)
                                  if cfg.train.checkpoint_every else contextlib.nullcontext()) as ckpt:
        return _train(cfg, workdir, ckpt, show_progress, allow_schedule_change)


def _train(cfg: Config, workdir: pathlib.Path, ckpt, show_progress: bool, allow_schedule_change: bool) -> list[dict]:
    t_cfg, m_cfg = cfg.train, cfg.model
    mesh = make_mesh(cfg)  # refuses (ConfigError) a mesh that misses the devices, heads, MLP width or batch

    if ckpt is not None and ckpt.latest_step() is not None:  # before tokenizing: a refusal comes at once
        resume.check(workdir, cfg, allow_schedule_change=allow_schedule_change)
    corpus, batches, val = pipeline.build(cfg, workdir)  # also saves workdir/tokenizer.json
    batch_sharding = NamedSharding(mesh, batch_spec(cfg, mesh))
    to_global = lambda local: jax.make_array_from_process_local_data(batch_sharding, local)
    val = [to_global(b) for b in val if len(b) * jax.process_count() % batch_devices(cfg, mesh) == 0]
    state = create_state(cfg, jax.random.key(t_cfg.seed), mesh)
    start, step_losses = 0, []
    if ckpt is not None:
        state, start, step_losses = _restore(cfg, ckpt, state, batches, corpus)
    if jax.process_index() == 0:
        (workdir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))

    train_step = make_train_step(cfg, mesh)
    diag_every = cfg.diagnostics.every
    diag_step = make_train_step(cfg, mesh, with_diagnostics=True) if diag_every else None
    eval_step = make_eval_step(cfg, mesh)
    bytes_per_token_V = jax.device_put(tokenizer_lib.bytes_per_token(corpus.tokenizer), NamedSharding(mesh, P()))
    n_params = sum(int(p.size) for p in jax.tree.leaves(state.params))
    tokens_per_step = t_cfg.batch_size * m_cfg.seq_len

    log: list[dict] = []
    metrics = _MetricsLog(cfg, workdir, start, step_losses)
    pending_losses: list = []  # every step's loss stays on the device until the loop next waits
    where = (f"metrics so far are in {workdir / 'metrics.jsonl'}"
             + (f", checkpoints (none after the failure) in {ckpt.directory}" if ckpt else ""))
    bar = tqdm(total=t_cfg.steps, initial=start, disable=not show_progress or jax.process_index() != 0,
               dynamic_ncols=True)
    last_time, last_step = time.perf_counter(), start
    saved_at = lambda step: f"{ckpt.directory}/{step}" if ckpt is not None else None
    stop = preemption.StopRequests().install()  # uninstalled in the finally below
    # Printed once signals are caught: from here on SIGTERM / SIGINT stop the run with a checkpoint.
    print(f"ANDREA: {n_params:,} parameters, {corpus.train_size}, "
          f"{jax.device_count()} {jax.devices()[0].platform} device(s) in {jax.process_count()} "
          f"process(es), ProRes {cfg.prores.schedule} T={cfg.prores.warmup}, attention: "
          f"{model_lib.attention_impl(cfg.model)[1]}" + (f", resumed at step {start}" if start else ""), flush=True)
    # The mesh is current while steps are traced, so the kernels see which axes split the rows.
    with jax.set_mesh(mesh):
        try:
            for step in range(start + 1, t_cfg.steps + 1):
                is_diag = bool(diag_every) and (step % diag_every == 0 or step == 1)
                state, step_metrics = (diag_step if is_diag else train_step)(state, to_global(next(batches)))
                pending_losses.append(step_metrics["loss"])
                is_ckpt = ckpt is not None and (step % t_cfg.checkpoint_every == 0 or step == t_cfg.steps)
                is_eval = (t_cfg.eval_every and step % t_cfg.eval_every == 0) or step == t_cfg.steps
                is_log = step % t_cfg.log_every == 0 or is_eval or is_diag
                signum = stop.agreed(at_sync_point=is_log or is_ckpt)
                if not (is_log or is_ckpt or signum):
                    continue
                # The host waits here: every loss since the last wait is checked before any save.
                new_losses = [float(v) for v in jax.device_get(pending_losses)]
                pending_losses.clear()
                metrics.step_losses += new_losses
                _check_losses(new_losses, step - len(new_losses) + 1, cfg, where)
                skipped = _check_skips(state, step, cfg, where) if cfg.optim.skip_nonfinite else None
                if ckpt is not None and (is_ckpt or signum):
                    if not bool(_all_finite(state.params)):  # a finite loss, then an overflowing update
                        raise TrainingError(f"the parameters after step {step} are not finite; {where}")
                    checkpoint.save(ckpt, step, state, pipeline.get_state(batches, cfg, corpus), metrics.step_losses)
                if not is_log:
                    if signum:
                        raise preemption.Stopped(signum, step, saved_at(step))
                    continue
                line = _metric_line(step, step_metrics)
                now = time.perf_counter()
                line["tokens_per_sec"] = tokens_per_step * (step - last_step) / (now - last_time)
                if skipped is not None:
                    line["skipped_updates"] = skipped
                if is_eval and val:
                    line |= evaluate(eval_step, state.params, state.step, val, bytes_per_token_V)
                    bar.write(f"step {step}: loss {line['loss']:.4f}  val_loss {line['val_loss']:.4f}")
                if is_eval:
                    line["spike_score"] = diag_lib.spike_score(
                        metrics.step_losses, cfg.diagnostics.spike_window, cfg.diagnostics.spike_sigmas)
                log.append(line)
                metrics.write(line)
                bar.set_postfix({k: f"{line[k]:.3g}" for k in ("loss", "val_loss", "tokens_per_sec") if k in line})
                bar.update(step - bar.n)
                last_time, last_step = time.perf_counter(), step
                if signum:  # after this step's line, which an uninterrupted run writes too
                    raise preemption.Stopped(signum, step, saved_at(step))
        finally:
            stop.uninstall()
            bar.close()
            metrics.step_losses += [float(v) for v in jax.device_get(pending_losses)]  # up to a failed step
            metrics.close()
            if ckpt is not None:
                ckpt.wait_until_finished()  # train() closes it

        if t_cfg.sample_tokens:
            params = None  # None: the sample reads the final checkpoint
            if jax.process_count() > 1:  # every process joins the gather of sharded parameters
                params = multihost_utils.process_allgather(state.params, tiled=True)
            elif ckpt is None:
                params = state.params
            if jax.process_index() == 0:
                print("--- sample ---\n" + _closing_sample(cfg, workdir, int(state.step), params,
                                                          corpus.tokenizer) + "\n--------------", flush=True)
    return log


def _closing_sample(cfg: Config, workdir: pathlib.Path, step: int, params, tok) -> str:
    """Text sampled with the KV-cache sampler from the run as the loader sees it: the final
    checkpoint where there is one (so the sample is what export and generate will give), else the
    parameters in memory (`params`). Only process 0 samples, so a multi-process run passes the
    parameters all processes gathered rather than reading a checkpoint the others would have to join."""
    if params is None:
        loaded = inference.load(workdir=workdir)
    else:
        loaded = inference.LoadedModel(cfg, params, tok, step, str(workdir))
    prompt = "\n"
    new = generate.generate(loaded, [tokenizer_lib.encode(tok, prompt)], max_new_tokens=cfg.train.sample_tokens,
                            temperature=0.8, seed=cfg.train.seed)[0]
    return prompt + tokenizer_lib.decode(tok, new)
