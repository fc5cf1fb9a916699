"""The training loop: data, the jitted steps of andrea_jax.steps, evaluation, logging, checkpoints
and resuming. The only module that knows about time.
"""
from __future__ import annotations

import json
import math
import pathlib
import time

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from tqdm import tqdm

from andrea_jax import checkpoint, diagnostics as diag_lib, generate, inference
from andrea_jax.config import Config
from andrea_jax.data import pipeline, tokenizer as tokenizer_lib
from andrea_jax.steps import create_state, evaluate, make_eval_step, make_mesh, make_train_step


class TrainingError(RuntimeError):
    """Training cannot go on (a non-finite loss): the message says at which step."""


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

    def __init__(self, cfg: Config, workdir: pathlib.Path, start_step: int):
        self.active = jax.process_index() == 0
        self.lines_path, self.losses_path = workdir / "metrics.jsonl", workdir / "step_losses.npy"
        kept, self.step_losses = [], []
        if start_step and self.active:
            if self.lines_path.exists():
                kept = [l for l in self.lines_path.read_text().splitlines()
                        if l.strip() and json.loads(l)["step"] <= start_step]
            if self.losses_path.exists():
                self.step_losses = [float(v) for v in np.load(self.losses_path)[:start_step]]
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


def _restore(cfg: Config, workdir: pathlib.Path, ckpt, state, batches, corpus):
    """(state, step) from the newest checkpoint of workdir, the data loader moved to match."""
    saved_cfg = workdir / "config.json"
    if saved_cfg.exists():
        before, now = json.loads(saved_cfg.read_text()), cfg.to_dict()
        changed = [f"{sec}.{key}" for sec in ("model", "prores", "data") for key in now[sec]
                   if before.get(sec, {}).get(key) != now[sec][key]]
        if changed:
            raise TrainingError(f"{workdir} holds checkpoints of a run with other settings "
                                f"({', '.join(changed)}); use another workdir or the same config")
    restored = checkpoint.restore_latest(ckpt, state)
    if restored is None:
        return state, 0
    state, data_state = restored
    pipeline.set_state(batches, cfg, corpus, data_state,
                       where=f"the data state of checkpoint {ckpt.directory}/{int(state.step)}")
    return state, int(state.step)


def train(cfg: Config, workdir: str | pathlib.Path, *, show_progress: bool = True) -> list[dict]:
    """Trains, resuming from the newest checkpoint in workdir if there is one; returns the metric
    lines logged by this call (all of them are in workdir/metrics.jsonl)."""
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    t_cfg, m_cfg = cfg.train, cfg.model
    if t_cfg.batch_size % jax.device_count():
        raise ValueError(f"train.batch_size={t_cfg.batch_size} is not divisible by the "
                         f"{jax.device_count()} devices")

    corpus, batches, val = pipeline.build(cfg, workdir)  # also saves workdir/tokenizer.json
    mesh = make_mesh()
    batch_sharding = NamedSharding(mesh, P("data"))
    to_global = lambda local: jax.make_array_from_process_local_data(batch_sharding, local)
    val = [to_global(b) for b in val if len(b) * jax.process_count() % jax.device_count() == 0]
    state = create_state(cfg, jax.random.key(t_cfg.seed), mesh)
    ckpt = checkpoint.manager(workdir, max_to_keep=t_cfg.keep_checkpoints) if t_cfg.checkpoint_every else None
    start = 0
    if ckpt is not None:
        state, start = _restore(cfg, workdir, ckpt, state, batches, corpus)
    if jax.process_index() == 0:
        (workdir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))

    train_step = make_train_step(cfg, mesh)
    diag_every = cfg.diagnostics.every
    diag_step = make_train_step(cfg, mesh, with_diagnostics=True) if diag_every else None
    eval_step = make_eval_step(cfg, mesh)
    bytes_per_token_V = jax.device_put(tokenizer_lib.bytes_per_token(corpus.tokenizer), NamedSharding(mesh, P()))
    n_params = sum(int(p.size) for p in jax.tree.leaves(state.params))
    tokens_per_step = t_cfg.batch_size * m_cfg.seq_len
    print(f"ANDREA: {n_params:,} parameters, {len(corpus.train_tokens):,} training tokens, "
          f"{jax.device_count()} {jax.devices()[0].platform} device(s) in {jax.process_count()} "
          f"process(es), ProRes {cfg.prores.schedule} T={cfg.prores.warmup}"
          + (f", resumed at step {start}" if start else ""), flush=True)

    log: list[dict] = []
    metrics = _MetricsLog(cfg, workdir, start)
    pending_losses: list = []  # every step's loss stays on the device until the next metric line
    bar = tqdm(total=t_cfg.steps, initial=start, disable=not show_progress or jax.process_index() != 0,
               dynamic_ncols=True)
    last_time, last_step = time.perf_counter(), start
    # The mesh is current while steps are traced, so the kernels see which axes split the rows.
    with jax.set_mesh(mesh):
        try:
            for step in range(start + 1, t_cfg.steps + 1):
                is_diag = bool(diag_every) and (step % diag_every == 0 or step == 1)
                state, step_metrics = (diag_step if is_diag else train_step)(state, to_global(next(batches)))
                pending_losses.append(step_metrics["loss"])
                if ckpt is not None and (step % t_cfg.checkpoint_every == 0 or step == t_cfg.steps):
                    checkpoint.save(ckpt, step, state, pipeline.get_state(batches, cfg, corpus))
                is_eval = (t_cfg.eval_every and step % t_cfg.eval_every == 0) or step == t_cfg.steps
                if step % t_cfg.log_every and not is_eval and not is_diag:
                    continue
                metrics.step_losses += [float(v) for v in jax.device_get(pending_losses)]
                pending_losses.clear()
                line = _metric_line(step, step_metrics)
                now = time.perf_counter()
                line["tokens_per_sec"] = tokens_per_step * (step - last_step) / (now - last_time)
                if not math.isfinite(line["loss"]):
                    raise TrainingError(f"non-finite loss {line['loss']} at step {step}; metrics so far are "
                                        f"in {workdir / 'metrics.jsonl'}"
                                        + (f", checkpoints in {ckpt.directory}" if ckpt else ""))
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
        finally:
            bar.close()
            metrics.step_losses += [float(v) for v in jax.device_get(pending_losses)]  # up to a failed step
            metrics.close()
            if ckpt is not None:
                ckpt.wait_until_finished()
                ckpt.close()

        if t_cfg.sample_tokens and jax.process_index() == 0:
            print("--- sample ---\n" + _closing_sample(cfg, workdir, state, corpus.tokenizer)
                  + "\n--------------", flush=True)
    return log


def _closing_sample(cfg: Config, workdir: pathlib.Path, state, tok) -> str:
    """Text sampled with the KV-cache sampler from the run as the loader sees it: the final
    checkpoint where there is one (so the sample is what export and generate will give), else the
    parameters in memory. Only process 0 samples, so in a multi-process run it takes its local copy
    of the replicated parameters rather than reading a checkpoint the others would have to join."""
    if cfg.train.checkpoint_every and jax.process_count() == 1:
        loaded = inference.load(workdir=workdir)
    else:
        local = jax.tree.map(lambda a: np.asarray(a.addressable_data(0)), state.params)
        loaded = inference.LoadedModel(cfg, local, tok, int(state.step), str(workdir))
    prompt = "\n"
    new = generate.generate(loaded, [tokenizer_lib.encode(tok, prompt)], max_new_tokens=cfg.train.sample_tokens,
                            temperature=0.8, seed=cfg.train.seed)[0]
    return prompt + tokenizer_lib.decode(tok, new)
