"""The jitted pieces of training: the train state, the loss, the train and eval steps, with the
shardings of andrea_jax.train.sharding over a (data, fsdp, tensor) mesh. ProRes alphas are computed
inside the step from `state.step`, so a new step never recompiles; a new batch shape (a ramp's
stage, andrea_jax.ramps) compiles once, as jit compiles once per input shape. Needs only jax, flax and optax:
GPU benchmarks use it without the data stack (andrea_jax.train.loop adds the loop, data, logging and
checkpoints).

The state is created in its shardings (a jitted init with out_shardings: no replicated copy
first) and the step keeps it there (same in/out shardings, the old state donated). The step
traces under the mesh and the config's axis rules, so the model's logical constraints and the
kernels' per-shard wrappers see the layout without the caller setting any context.
"""
from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import NamedSharding, PartitionSpec as P

from andrea_jax.train import chunked_loss, diagnostics as diag_lib, optim, sharding
from andrea_jax import model as model_lib, ramps
from andrea_jax.data import segments
from andrea_jax.model import depth, prores
from andrea_jax.config import Config

def cross_entropy(logits_BTV, targets_BT):
    """Mean next-token cross-entropy with a float32 log-softmax."""
    return optax.softmax_cross_entropy_with_integer_labels(logits_BTV.astype(jnp.float32), targets_BT).mean()


def z_loss_term(logits_BTV, coefficient: float):
    """coefficient * mean(log Z)^2 with Z the softmax's normaliser (PaLM's auxiliary loss, which
    keeps the logits from drifting: log Z near 0 makes the softmax close to its logits' exp)."""
    log_z_BT = jax.nn.logsumexp(logits_BTV.astype(jnp.float32), axis=-1)
    return coefficient * jnp.mean(jnp.square(log_z_BT))


def document_inputs(model, tokens_BT, eot_id: int | None) -> dict:
    """The model's keyword inputs of data.document_mask: none when eot_id is None, else the rows'
    segment ids, and their positions within each document under model.reset_positions."""
    if eot_id is None:
        return {}
    segment_ids_BT, positions_BT = segments.document_segments(tokens_BT, eot_id)
    return {"segment_ids_BT": segment_ids_BT} | ({"positions_BT": positions_BT} if model.cfg.reset_positions else {})


def _apply(params, model, tokens_BT1, alphas_L, eot_id):
    tokens_BT = tokens_BT1[:, :-1]
    return model.apply({"params": params}, tokens_BT, alphas_L, **document_inputs(model, tokens_BT, eot_id))


def loss_model(cfg: Config, **kwargs):
    """The model the train and eval steps apply: padded logits, or with model.loss_chunks the
    logits' operands, which `losses` turns into the loss a chunk at a time."""
    return model_lib.Andrea(cfg.model, cfg.kernels.impl, padded_logits=True,
                            head_operands=cfg.model.loss_chunks > 0, **kwargs)


def losses(out, model, targets_BT, z_loss: float = 0.0):
    """(mean cross-entropy, z-loss term or None when the coefficient is 0) of the model's output:
    from its logits, or from their operands in model.loss_chunks chunks of positions."""
    if not model.head_operands:
        return cross_entropy(out.logits, targets_BT), (z_loss_term(out.logits, z_loss) if z_loss else None)
    ce, mean_sq_lse = chunked_loss.losses(*out.logits, targets_BT, model.cfg.vocab_size, model.cfg.loss_chunks,
                                          model.scan_unroll)
    return ce, (z_loss * mean_sq_lse if z_loss else None)


def loss_fn(params, model, tokens_BT1, alphas_L, eot_id: int | None = None):
    """Mean cross-entropy of the batch's next tokens; eot_id: data.document_mask's (None: off)."""
    return losses(_apply(params, model, tokens_BT1, alphas_L, eot_id), model, tokens_BT1[:, 1:])[0]


def objective(params, model, tokens_BT1, alphas_L, z_loss: float = 0.0, eot_id: int | None = None):
    """What the train step differentiates: (cross-entropy + z-loss, (cross-entropy, aux)), aux a
    dict of `stats` (the scan's per-layer statistics of a model built with diagnostics=True, else
    None) and `z_loss` (its term; None when the coefficient is 0)."""
    out = _apply(params, model, tokens_BT1, alphas_L, eot_id)
    loss, z = losses(out, model, tokens_BT1[:, 1:], z_loss)
    return loss + (0.0 if z is None else z), (loss, {"stats": out.stats, "z_loss": z})


def _block_update_scales(cfg: Config, hidden_lr: float, step) -> jax.Array:
    """[L]: block l's AdamW update multiplier, prores.scale_updates's factor times
    model.depth_param's hidden-LR factor."""
    return prores.update_scales(cfg, step) * jnp.float32(hidden_lr)


@functools.lru_cache(maxsize=None)
def _tx_and_model(cfg: Config):
    """One optimizer and one model per config: they sit in the TrainState's tree structure, which
    the jitted step's shardings must match, so create_state and make_train_step share them."""
    hidden_lr = depth.hidden_lr_scale(cfg.model)
    scales = None
    if cfg.prores.scale_updates != "none" or hidden_lr != 1.0:
        scales = functools.partial(_block_update_scales, cfg, hidden_lr)
    optim_cfg = dataclasses.replace(cfg.optim, eps=cfg.optim.eps * depth.eps_scale(cfg.model))
    return (optim.make(optim_cfg, ramps.total(cfg), cfg.model.family, scales, n_layer=cfg.model.n_layer,
                       clock=_clock(cfg)), model_lib.Andrea(cfg.model, cfg.kernels.impl))


def _clock(cfg: Config):
    """What the LR schedule reads of the completed steps: None (their count), or a ramp's token clock."""
    return functools.partial(ramps.clock, cfg) if ramps.ramped(cfg) else None


def _fresh_state(cfg: Config, rng) -> train_state.TrainState:
    tx, model = _tx_and_model(cfg)
    params = model_lib.init(cfg.model, rng, cfg.kernels.impl)["params"]
    # A strongly typed int32 step, as the jitted step returns it: no retrace on call 2.
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx).replace(
        step=jnp.zeros((), jnp.int32))


@functools.lru_cache(maxsize=None)
def _abstract(cfg: Config) -> train_state.TrainState:
    return jax.eval_shape(functools.partial(_fresh_state, cfg), jax.random.key(0))


@functools.lru_cache(maxsize=None)
def state_shardings(cfg: Config, mesh: jax.sharding.Mesh) -> train_state.TrainState:
    """The TrainState's tree of NamedShardings (params by the axis rules, Adam's moments alike)."""
    return sharding.state_shardings(_abstract(cfg), _tx_and_model(cfg)[0], cfg, mesh)


def abstract_state(cfg: Config, mesh: jax.sharding.Mesh) -> train_state.TrainState:
    """The state as ShapeDtypeStructs carrying their shardings: allocates nothing (memory
    analysis, restore targets)."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        _abstract(cfg), state_shardings(cfg, mesh))


def create_state(cfg: Config, rng, mesh: jax.sharding.Mesh) -> train_state.TrainState:
    """A fresh train state, created directly in its shardings over the mesh (each device
    initialises only its own shards)."""
    sharding.check(cfg, mesh)
    return jax.jit(functools.partial(_fresh_state, cfg), out_shardings=state_shardings(cfg, mesh))(rng)


def make_mesh(cfg: Config | None = None, devices=None) -> jax.sharding.Mesh:
    """The (data, fsdp, tensor) mesh of cfg.mesh (andrea_jax.train.sharding.make_mesh); with no config,
    every device on `data`."""
    return sharding.make_mesh(cfg, devices)


def batch_sharding(cfg: Config, mesh: jax.sharding.Mesh) -> NamedSharding:
    """Where a global [batch, ...] array of tokens lives: rows split like the logical `batch`."""
    return NamedSharding(mesh, sharding.batch_spec(cfg, mesh))


def _in_layout(cfg: Config, mesh: jax.sharding.Mesh, fn):
    """fn traced under the mesh and the config's axis rules: the model's logical constraints and
    the kernels' row splits act whether or not the caller set a mesh."""
    table = sharding.rules(cfg, mesh)

    @functools.wraps(fn)
    def traced(*args):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(table):
            return fn(*args)
    return traced


def _microbatched(grad_fn, cfg: Config, mesh: jax.sharding.Mesh, param_shardings):
    """grad_fn(params, tokens_BT1) -> ((loss, aux), grads), run over train.microbatches slices of
    the batch by a lax.scan that sums the gradients: one slice's activations live at a time.
    Returns the means over slices (equal slices: the mean over the whole batch)."""
    k = cfg.train.microbatches
    if k == 1:
        return grad_fn
    rows = sharding.batch_spec(cfg, mesh)[0]

    def accumulated(params, tokens_BT1):
        B, T1 = tokens_BT1.shape
        # Slice j takes rows j, j + k, ...: every device's rows hold B / k / devices rows of each
        # slice (the config checks it divides), so slicing moves no tokens between devices.
        tokens_kMT1 = jax.lax.with_sharding_constraint(
            tokens_BT1.reshape(B // k, k, T1).swapaxes(0, 1), NamedSharding(mesh, P(None, rows)))
        pin = lambda g: jax.lax.with_sharding_constraint(g, param_shardings)  # sums stay sharded

        def body(acc, tokens_MT1):
            (loss, aux), grads = grad_fn(params, tokens_MT1)
            loss_sum, grad_sum = acc
            return (loss_sum + loss, pin(jax.tree.map(jnp.add, grad_sum, grads))), aux

        zeros = pin(jax.tree.map(jnp.zeros_like, params))
        (loss_sum, grad_sum), aux_k = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), tokens_kMT1)
        mean = lambda a: jnp.mean(a, axis=0) if a is not None else None
        return (loss_sum / k, jax.tree.map(mean, aux_k)), jax.tree.map(lambda g: g / k, grad_sum)

    return accumulated


def apply_update(state: train_state.TrainState, grads, loss=None) -> train_state.TrainState:
    """One optimizer update, as TrainState.apply_gradients makes it, with the step count and the
    batch's loss passed to the optimizer (prores.scale_updates computes its block factors from the
    step, optim.skip_spikes tests the loss)."""
    extra = {} if loss is None else {"loss": loss}
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params, step=state.step, **extra)
    return state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                         opt_state=opt_state)


def _eot_if_masked(cfg: Config, eot_id: int) -> int | None:
    return eot_id if cfg.data.document_mask else None


def make_train_step(cfg: Config, mesh: jax.sharding.Mesh, *, with_diagnostics: bool = False,
                    scan_unroll: int | bool = 1, eot_id: int = 0):
    """The jitted update. `with_diagnostics` compiles a second version of the same update that
    also returns, per layer [L], the scan's statistics (andrea_jax.model.Block), the gradient norm
    of the block's parameters and the effective alpha; the loop calls it every
    `diagnostics.every` steps, so ordinary steps compute none of them. With train.microbatches
    > 1 the loss, gradients and statistics are means over the microbatches. Metrics: loss (the
    cross-entropy), grad_norm, lr; z_loss with optim.z_loss; skipped_spikes (so far) with
    optim.skip_spikes, whose test is given the step's loss. `scan_unroll` is the model's
    (andrea_jax.model.Andrea): andrea_jax.aot counts FLOPs on an unrolled step. eot_id: the
    tokenizer's <|endoftext|>, where data.document_mask cuts the rows into documents (0 in the
    tokenizers trained here; the trainer passes its run's)."""
    sharding.check(cfg, mesh)
    model = loss_model(cfg, diagnostics=with_diagnostics, scan_unroll=scan_unroll)
    schedule = optim.on_clock(optim.lr_schedule(cfg.optim, ramps.total(cfg)), _clock(cfg))
    state_sh = state_shardings(cfg, mesh)

    def train_step(state, tokens_BT1):
        alphas_L = prores.run_alphas(cfg, state.step)  # inside jit: a new step never recompiles

        def grad_fn(params, tokens):
            (_, (loss, aux)), grads = jax.value_and_grad(objective, has_aux=True)(
                params, model, tokens, alphas_L, cfg.optim.z_loss, _eot_if_masked(cfg, eot_id))
            return (loss, aux), grads

        (loss, aux), grads = _microbatched(grad_fn, cfg, mesh, state_sh.params)(state.params, tokens_BT1)
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), "lr": schedule(state.step)}
        if aux["z_loss"] is not None:
            metrics["z_loss"] = aux["z_loss"]
        new_state = apply_update(state, grads, loss)
        if (spikes := optim.spike_state(new_state.opt_state)) is not None:
            metrics["skipped_spikes"] = spikes.skipped
        if with_diagnostics:
            metrics |= {**aux["stats"], "layer_grad_norm": diag_lib.layer_norms(grads["blocks"]),
                        "update_ratio": diag_lib.update_ratios(new_state.params["blocks"], state.params["blocks"])}
        return new_state, metrics

    replicated = NamedSharding(mesh, P())  # a prefix: every metric is replicated
    return jax.jit(_in_layout(cfg, mesh, train_step), in_shardings=(state_sh, batch_sharding(cfg, mesh)),
                   out_shardings=(state_sh, replicated), donate_argnums=0)


def make_eval_step(cfg: Config, mesh: jax.sharding.Mesh, eot_id: int = 0):
    """(params, step, tokens_BT1, bytes_per_token_V) -> (mean loss, UTF-8 bytes of the targets);
    eot_id as make_train_step's."""
    model = loss_model(cfg)

    def eval_step(params, step, tokens_BT1, bytes_per_token_V):
        loss = loss_fn(params, model, tokens_BT1, prores.run_alphas(cfg, step), _eot_if_masked(cfg, eot_id))
        return loss, bytes_per_token_V[tokens_BT1[:, 1:]].sum()

    replicated = NamedSharding(mesh, P())
    return jax.jit(_in_layout(cfg, mesh, eval_step),
                   in_shardings=(sharding.param_shardings(cfg, mesh), replicated, batch_sharding(cfg, mesh),
                                 replicated))


def make_knockout_step(cfg: Config, mesh: jax.sharding.Mesh, eot_id: int = 0):
    """(params, step, tokens_BT1) -> [L] mean losses, entry l with block l's alpha set to 0 (its
    branches removed; a learned gate multiplies the 0): a pass over the L one-hot masks of the
    alphas, which are an input of the model, so nothing is retraced or copied. The masks go
    diagnostics.knockout_chunk at a time through one vmapped forward (lax.map over the chunks;
    0: all L at once), which bounds the activations held to a chunk's. eot_id as make_train_step's."""
    model = loss_model(cfg)
    chunk = cfg.diagnostics.knockout_chunk or cfg.model.n_layer

    def knockout_step(params, step, tokens_BT1):
        alphas_L = prores.run_alphas(cfg, step)
        kept_LL = 1.0 - jnp.eye(cfg.model.n_layer, dtype=jnp.float32)
        masked_loss = lambda kept_L: loss_fn(params, model, tokens_BT1, alphas_L * kept_L, _eot_if_masked(cfg, eot_id))
        if chunk >= cfg.model.n_layer:
            return jax.vmap(masked_loss)(kept_LL)
        return jax.lax.map(masked_loss, kept_LL, batch_size=chunk)

    replicated = NamedSharding(mesh, P())
    return jax.jit(_in_layout(cfg, mesh, knockout_step),
                   in_shardings=(sharding.param_shardings(cfg, mesh), replicated, batch_sharding(cfg, mesh)),
                   out_shardings=replicated)


def knockout(knockout_step, params, step, batches, val_loss: float) -> list[float]:
    """Per block, the mean validation loss over `batches` with its alpha at 0, minus val_loss."""
    losses_NL = np.asarray(jax.device_get([knockout_step(params, step, b) for b in batches]), np.float64)
    return [float(x) for x in losses_NL.mean(axis=0) - val_loss]


def evaluate(eval_step, params, step, batches, bytes_per_token_V) -> dict:
    """val_loss (mean nats per token) and val_bpb (summed nats / ln 2 / UTF-8 bytes of the targets)
    over equal-sized batches."""
    losses, n_bytes = zip(*jax.device_get([eval_step(params, step, b, bytes_per_token_V) for b in batches]))
    n_tokens = sum(b.shape[0] * (b.shape[1] - 1) for b in batches)
    val_loss = float(np.mean(losses))
    return {"val_loss": val_loss, "val_bpb": val_loss * n_tokens / (np.log(2.0) * float(np.sum(n_bytes)))}
