"""The train state, the jitted train step (ProRes alphas computed inside from `state.step`),
evaluation, and the loop with its logging. The only module that knows about time.
"""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import NamedSharding, PartitionSpec as P
from tqdm import tqdm

from andrea_jax import generate, model as model_lib, optim, prores
from andrea_jax.config import Config
from andrea_jax.data import pipeline


class TrainingError(RuntimeError):
    """Training cannot go on (a non-finite loss): the message says at which step."""


def cross_entropy(logits_BTV, targets_BT):
    """Mean next-token cross-entropy with a float32 log-softmax."""
    return optax.softmax_cross_entropy_with_integer_labels(logits_BTV.astype(jnp.float32), targets_BT).mean()


def loss_fn(params, model, tokens_BT1, alphas_L):
    logits = model.apply({"params": params}, tokens_BT1[:, :-1], alphas_L)
    return cross_entropy(logits, tokens_BT1[:, 1:])


def step_alphas(cfg: Config, step):
    return prores.alphas(step, cfg.model.n_layer, schedule=cfg.prores.schedule, warmup=cfg.prores.warmup)


def create_state(cfg: Config, rng, mesh: jax.sharding.Mesh) -> train_state.TrainState:
    """A fresh train state, replicated over the mesh (placed as the jitted step will return it)."""
    model = model_lib.Andrea(cfg.model, cfg.kernels.impl)
    params = model_lib.init(cfg.model, rng, cfg.kernels.impl)["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params,
                                          tx=optim.make(cfg.optim, cfg.train.steps))
    # A strongly typed int32 step on the mesh, as the jitted step returns it: no retrace on call 2.
    return jax.device_put(state.replace(step=jnp.zeros((), jnp.int32)), NamedSharding(mesh, P()))


def make_mesh() -> jax.sharding.Mesh:
    """A 1-D data-parallel mesh over every device: the batch is split, the state replicated."""
    # Auto axes: jit places the arrays by the shardings given; no sharding-in-types bookkeeping.
    return jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))


def make_train_step(cfg: Config, mesh: jax.sharding.Mesh):
    model = model_lib.Andrea(cfg.model, cfg.kernels.impl)
    schedule = optim.lr_schedule(cfg.optim, cfg.train.steps)

    def train_step(state, tokens_BT1):
        alphas_L = step_alphas(cfg, state.step)  # inside jit: a new step never recompiles
        loss, grads = jax.value_and_grad(loss_fn)(state.params, model, tokens_BT1, alphas_L)
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), "lr": schedule(state.step)}
        return state.apply_gradients(grads=grads), metrics

    replicated = NamedSharding(mesh, P())  # a prefix: the whole state is replicated
    return jax.jit(train_step, in_shardings=(replicated, NamedSharding(mesh, P("data"))),
                   out_shardings=(replicated, replicated), donate_argnums=0)


def make_eval_step(cfg: Config, mesh: jax.sharding.Mesh):
    model = model_lib.Andrea(cfg.model, cfg.kernels.impl)

    def eval_step(params, step, tokens_BT1):
        return loss_fn(params, model, tokens_BT1, step_alphas(cfg, step))

    return jax.jit(eval_step, in_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P()),
                                            NamedSharding(mesh, P("data"))))


def evaluate(eval_step, params, step, batches) -> float:
    return float(np.mean([float(eval_step(params, step, b)) for b in batches]))


def train(cfg: Config, workdir: str | pathlib.Path, *, show_progress: bool = True) -> list[dict]:
    """Trains from scratch; returns the logged metric lines (also in workdir/metrics.jsonl)."""
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    t_cfg, m_cfg = cfg.train, cfg.model
    if t_cfg.batch_size % jax.device_count():
        raise ValueError(f"train.batch_size={t_cfg.batch_size} is not divisible by the "
                         f"{jax.device_count()} devices")
    (workdir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))

    corpus = pipeline.prepare(source=cfg.data.source, vocab_size=m_cfg.vocab_size,
                              val_fraction=cfg.data.val_fraction, seq_len=m_cfg.seq_len,
                              tokenizer_path=cfg.data.tokenizer)
    corpus.tokenizer.save(str(workdir / "tokenizer.json"))
    batches = pipeline.train_iterator(pipeline.train_dataset(
        corpus.train_tokens, seq_len=m_cfg.seq_len, batch_size=t_cfg.batch_size, seed=t_cfg.seed,
        process_index=jax.process_index(), process_count=jax.process_count()))
    val = pipeline.val_batches(corpus.val_tokens, seq_len=m_cfg.seq_len,
                               batch_size=t_cfg.batch_size, max_batches=t_cfg.eval_batches)
    val = [b for b in val if len(b) % jax.device_count() == 0]

    mesh = make_mesh()
    state = create_state(cfg, jax.random.key(t_cfg.seed), mesh)
    train_step = make_train_step(cfg, mesh)
    eval_step = make_eval_step(cfg, mesh)
    n_params = sum(int(p.size) for p in jax.tree.leaves(state.params))
    tokens_per_step = t_cfg.batch_size * m_cfg.seq_len
    print(f"ANDREA: {n_params:,} parameters, {len(corpus.train_tokens):,} training tokens, "
          f"{jax.device_count()} {jax.devices()[0].platform} device(s), ProRes {cfg.prores.schedule} "
          f"T={cfg.prores.warmup}", flush=True)

    log: list[dict] = []
    metrics_file = (workdir / "metrics.jsonl").open("w")
    bar = tqdm(total=t_cfg.steps, disable=not show_progress, dynamic_ncols=True)
    last_time, last_step = time.perf_counter(), 0
    try:
        for step in range(1, t_cfg.steps + 1):
            state, metrics = train_step(state, next(batches))
            is_eval = (t_cfg.eval_every and step % t_cfg.eval_every == 0) or step == t_cfg.steps
            if step % t_cfg.log_every and not is_eval:
                continue
            line = {"step": step, **{k: float(v) for k, v in jax.device_get(metrics).items()}}
            now = time.perf_counter()
            line["tokens_per_sec"] = tokens_per_step * (step - last_step) / (now - last_time)
            if not math.isfinite(line["loss"]):
                raise TrainingError(f"non-finite loss {line['loss']} at step {step}; "
                                    f"metrics so far are in {workdir / 'metrics.jsonl'}")
            if is_eval and val:
                line["val_loss"] = evaluate(eval_step, state.params, state.step, val)
                bar.write(f"step {step}: loss {line['loss']:.4f}  val_loss {line['val_loss']:.4f}")
            log.append(line)
            metrics_file.write(json.dumps(line) + "\n")
            metrics_file.flush()
            bar.set_postfix({k: f"{line[k]:.3g}" for k in ("loss", "val_loss", "tokens_per_sec") if k in line})
            bar.update(step - bar.n)
            last_time, last_step = time.perf_counter(), step
    finally:
        bar.close()
        metrics_file.close()

    if t_cfg.sample_tokens:
        text = generate.sample_text(cfg, state.params, corpus.tokenizer, step_alphas(cfg, state.step),
                                    prompt="\n", num_tokens=t_cfg.sample_tokens,
                                    rng=jax.random.key(t_cfg.seed))
        print("--- sample ---\n" + text + "\n--------------", flush=True)
    return log
