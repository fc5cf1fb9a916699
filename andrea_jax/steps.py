"""The jitted pieces of training: the train state, the loss, the train and eval steps with their
explicit shardings over a 1-D data mesh. ProRes alphas are computed inside the step from
`state.step`, so a new step never recompiles. Needs only jax, flax and optax: GPU benchmarks use it
without the data stack (andrea_jax.trainer adds the loop, data, logging and checkpoints).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import NamedSharding, PartitionSpec as P

from andrea_jax import diagnostics as diag_lib, model as model_lib, optim, prores
from andrea_jax.config import Config


def cross_entropy(logits_BTV, targets_BT):
    """Mean next-token cross-entropy with a float32 log-softmax."""
    return optax.softmax_cross_entropy_with_integer_labels(logits_BTV.astype(jnp.float32), targets_BT).mean()


def loss_fn(params, model, tokens_BT1, alphas_L):
    logits = model.apply({"params": params}, tokens_BT1[:, :-1], alphas_L)
    return cross_entropy(logits, tokens_BT1[:, 1:])


def loss_and_stats(params, model, tokens_BT1, alphas_L):
    """loss_fn of a model built with diagnostics=True: (loss, per-layer stats of the scan)."""
    logits, stats_L = model.apply({"params": params}, tokens_BT1[:, :-1], alphas_L)
    return cross_entropy(logits, tokens_BT1[:, 1:]), stats_L


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


def make_train_step(cfg: Config, mesh: jax.sharding.Mesh, *, with_diagnostics: bool = False):
    """The jitted update. `with_diagnostics` compiles a second version of the same update that
    also returns, per layer [L], the scan's statistics (andrea_jax.model.Block), the gradient norm
    of the block's parameters and the effective alpha; the loop calls it every
    `diagnostics.every` steps, so ordinary steps compute none of them."""
    model = model_lib.Andrea(cfg.model, cfg.kernels.impl, diagnostics=with_diagnostics)
    schedule = optim.lr_schedule(cfg.optim, cfg.train.steps)

    def train_step(state, tokens_BT1):
        alphas_L = step_alphas(cfg, state.step)  # inside jit: a new step never recompiles
        if with_diagnostics:
            (loss, stats_L), grads = jax.value_and_grad(loss_and_stats, has_aux=True)(
                state.params, model, tokens_BT1, alphas_L)
        else:
            loss, grads = jax.value_and_grad(loss_fn)(state.params, model, tokens_BT1, alphas_L)
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), "lr": schedule(state.step)}
        if with_diagnostics:
            metrics |= {**stats_L, "layer_grad_norm": diag_lib.layer_norms(grads["blocks"])}
        return state.apply_gradients(grads=grads), metrics

    replicated = NamedSharding(mesh, P())  # a prefix: the whole state is replicated
    return jax.jit(train_step, in_shardings=(replicated, NamedSharding(mesh, P("data"))),
                   out_shardings=(replicated, replicated), donate_argnums=0)


def make_eval_step(cfg: Config, mesh: jax.sharding.Mesh):
    """(params, step, tokens_BT1, bytes_per_token_V) -> (mean loss, UTF-8 bytes of the targets)."""
    model = model_lib.Andrea(cfg.model, cfg.kernels.impl)

    def eval_step(params, step, tokens_BT1, bytes_per_token_V):
        loss = loss_fn(params, model, tokens_BT1, step_alphas(cfg, step))
        return loss, bytes_per_token_V[tokens_BT1[:, 1:]].sum()

    replicated = NamedSharding(mesh, P())
    return jax.jit(eval_step, in_shardings=(replicated, replicated, NamedSharding(mesh, P("data")), replicated))


def evaluate(eval_step, params, step, batches, bytes_per_token_V) -> dict:
    """val_loss (mean nats per token) and val_bpb (summed nats / ln 2 / UTF-8 bytes of the targets)
    over equal-sized batches."""
    losses, n_bytes = zip(*jax.device_get([eval_step(params, step, b, bytes_per_token_V) for b in batches]))
    n_tokens = sum(b.shape[0] * (b.shape[1] - 1) for b in batches)
    val_loss = float(np.mean(losses))
    return {"val_loss": val_loss, "val_bpb": val_loss * n_tokens / (np.log(2.0) * float(np.sum(n_bytes)))}
