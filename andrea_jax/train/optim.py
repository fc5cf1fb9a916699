"""AdamW (or Muon with AdamW, train/muon.py) with global-norm clipping and the learning-rate
schedules, all from optax, behind a finiteness guard that can skip an update whose gradient is not
finite (optim.skip_nonfinite), optionally behind a loss-spike guard (optim.skip_spikes) and
followed by ProRes's per-block update scaling (prores.scale_updates)."""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from andrea_jax.config import OptimConfig
from andrea_jax.model.transformer import FAMILIES
from andrea_jax.train import muon


def lr_schedule(cfg: OptimConfig, total_steps: float, peak: float | None = None) -> optax.Schedule:
    """optim.schedule rising to `peak` (default optim.lr), over `total_steps` (a float on a ramp's
    token clock, andrea_jax.ramps)."""
    peak = cfg.lr if peak is None else peak
    warmup = min(cfg.warmup_steps, total_steps)
    if cfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=peak, warmup_steps=warmup,
            decay_steps=max(total_steps, warmup + 1), end_value=peak * cfg.min_lr_ratio)
    if cfg.schedule == "wsd":
        decay = min(cfg.decay_steps, total_steps) or max(1, int(round(total_steps * cfg.decay_fraction)))
        stable = max(0, total_steps - warmup - decay)
        return optax.join_schedules(
            [optax.linear_schedule(0.0, peak, max(warmup, 1)),
             optax.constant_schedule(peak),
             optax.linear_schedule(peak, 0.0, decay)],
            boundaries=[warmup, warmup + stable])
    raise ValueError(f"unknown LR schedule {cfg.schedule!r}")


def on_clock(schedule: optax.Schedule, clock: Callable[[jax.Array], jax.Array] | None) -> optax.Schedule:
    """`schedule` read at clock(count) (a ramp's tokens seen, andrea_jax.ramps.clock), or at the count itself."""
    return schedule if clock is None else lambda count: schedule(clock(count))


def _names(path) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", k)) for k in path)


def decay_mask(params, family: str = "gpt2"):
    """Which parameters weight decay applies to: model.family's rule (its module's `decays`)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model.family {family!r}")
    decays = FAMILIES[family].decays
    return jax.tree_util.tree_map_with_path(lambda path, _: decays(_names(path)), params)


def scale_block_updates(inner: optax.GradientTransformation,
                        block_scales: Callable[[jax.Array], jax.Array]) -> optax.GradientTransformationExtraArgs:
    """`inner`, then every update of the stacked block parameters (`updates["blocks"]`, leaves
    [L, ...]) multiplied by block l's factor `block_scales(step)[l]`; the embeddings, final norm
    and head are left as `inner` made them. `step` is an extra argument of `update` (the count of
    completed updates, the one the forward pass computed its alphas from), so the factors come
    from the same step as the gradient, inside the jitted step.

    Placed after AdamW, the factor also scales the decoupled weight decay (optax's adamw
    multiplies its decay by the learning rate, so decay is part of the update): the factor acts as
    a per-block learning-rate multiplier. That keeps each block's balance between its Adam step
    and its decay (the weight norm AdamW settles at) as the unscaled run has it, and a block at
    alpha 0, which the forward pass does not use and which gets no gradient, does not move at all:
    unscaled decay would shrink it towards 0 before it is switched on.

    The state is `inner`'s own, so the optimizer state has one tree with scaling on or off:
    checkpoints written before the option existed restore into it."""
    inner = optax.with_extra_args_support(inner)

    def update(updates, state, params=None, *, step=None, **extra_args):
        updates, state = inner.update(updates, state, params, **extra_args)
        if step is None:
            raise ValueError("prores.scale_updates: the optimizer update needs step= (the count of "
                             "completed updates), as andrea_jax.train.steps passes it")
        scales_L = block_scales(step)

        def scaled(u):
            return u * scales_L.reshape(-1, *(1,) * (u.ndim - 1)).astype(u.dtype)
        return {**updates, "blocks": jax.tree.map(scaled, updates["blocks"])}, state

    return optax.GradientTransformationExtraArgs(inner.init, update)


class SpikeState(NamedTuple):
    """skip_loss_spikes's state: a ring of the last W applied losses and of their per-block
    gradient norms, the counts, and what the latest skipped update looked like."""
    losses_W: jax.Array          # float32 [W]
    block_norms_WL: jax.Array    # float32 [W, L]
    taken: jax.Array             # int32: losses written to the ring so far (slot = taken % W)
    skipped: jax.Array           # int32: updates skipped as spikes
    last_step: jax.Array         # int32: the step count of the latest skipped update; -1: none yet
    last_loss: jax.Array         # float32: its loss, and the window's mean and std it was tested against
    last_mean: jax.Array
    last_std: jax.Array
    last_jump_L: jax.Array       # float32 [L]: its block gradient norms over their window means
    inner_state: optax.OptState


def block_grad_norms(blocks) -> jax.Array:
    """[L] global norm of each block's slice of the stacked block parameters (leaves [L, ...])."""
    squares = [jnp.sum(jnp.square(g.astype(jnp.float32)).reshape(g.shape[0], -1), axis=1)
               for g in jax.tree.leaves(blocks)]
    return jnp.sqrt(sum(squares))


def skip_loss_spikes(inner: optax.GradientTransformation, sigmas: float, window: int,
                     n_layer: int) -> optax.GradientTransformationExtraArgs:
    """`inner`, except that an update whose loss (`update`'s extra argument loss=, the loss of the
    batch the gradient came from) is more than `sigmas` standard deviations above the mean of the
    last `window` applied losses is not applied: zero updates, `inner`'s state (Adam's moments,
    its count) left as it was, as optax.apply_if_finite does for a non-finite gradient. The test
    acts once the window is full, and a skipped loss does not enter it, so one spike does not
    widen the band that lets the next one through. OLMo-core's SkipStepOptimizer tests the same
    rule (its sigma_factor, over 128 recent losses).

    The state (SpikeState) lives in the optimizer state, hence in checkpoints: a resumed run tests
    its first steps against the same window. A non-finite loss is never a spike here and never
    enters the window; optim.skip_nonfinite handles it."""
    inner = optax.with_extra_args_support(inner)

    def init(params):
        return SpikeState(jnp.zeros((window,), jnp.float32), jnp.zeros((window, n_layer), jnp.float32),
                          jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), jnp.full((), -1, jnp.int32),
                          jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32),
                          jnp.zeros((n_layer,), jnp.float32), inner.init(params))

    def update(updates, state: SpikeState, params=None, *, loss=None, **extra_args):
        if loss is None:
            raise ValueError("optim.skip_spikes: the optimizer update needs loss= (the batch's loss), as "
                             "andrea_jax.train.steps passes it")
        loss = jnp.asarray(loss, jnp.float32)
        mean, std = jnp.mean(state.losses_W), jnp.std(state.losses_W)
        spike = (state.taken >= window) & jnp.isfinite(loss) & (loss > mean + sigmas * std)
        updates_out, inner_state = jax.lax.cond(
            spike, lambda: (optax.tree.zeros_like(updates), state.inner_state),
            lambda: inner.update(updates, state.inner_state, params, **extra_args))
        norms_L = block_grad_norms(updates["blocks"])
        jump_L = norms_L / jnp.maximum(jnp.mean(state.block_norms_WL, axis=0), jnp.finfo(jnp.float32).tiny)
        take, slot = jnp.isfinite(loss) & ~spike, state.taken % window
        step = jnp.asarray(extra_args.get("step", -1), jnp.int32)
        pick = lambda new, old: jnp.where(spike, new, old)
        return updates_out, SpikeState(
            losses_W=jnp.where(take, state.losses_W.at[slot].set(loss), state.losses_W),
            block_norms_WL=jnp.where(take, state.block_norms_WL.at[slot].set(norms_L), state.block_norms_WL),
            taken=state.taken + take.astype(jnp.int32), skipped=state.skipped + spike.astype(jnp.int32),
            last_step=pick(step, state.last_step), last_loss=pick(loss, state.last_loss),
            last_mean=pick(mean, state.last_mean), last_std=pick(std, state.last_std),
            last_jump_L=pick(jump_L, state.last_jump_L), inner_state=inner_state)

    return optax.GradientTransformationExtraArgs(init, update)


class EmaState(NamedTuple):
    """params_ema's state: the moving average (a copy of the parameter tree, sharded like it) and
    the wrapped optimizer's state."""
    ema: optax.Params
    inner_state: optax.OptState


def params_ema(inner: optax.GradientTransformation, decay: float) -> optax.GradientTransformationExtraArgs:
    """`inner`, keeping beside its state an exponential moving average of the parameters each
    update produces: ema <- decay ema + (1 - decay) (params + updates), from the initial parameters.
    The updates are `inner`'s, unchanged; the average only watches. In the optimizer state it is
    checkpointed, restored and sharded like Adam's moments."""
    inner = optax.with_extra_args_support(inner)

    def init(params):
        return EmaState(params, inner.init(params))

    def update(updates, state: EmaState, params=None, **extra_args):
        if params is None:
            raise ValueError("optim.ema: the optimizer update needs the parameters")
        updates, inner_state = inner.update(updates, state.inner_state, params, **extra_args)
        ema = jax.tree.map(lambda e, p, u: (decay * e + (1 - decay) * (p + u)).astype(e.dtype),
                           state.ema, params, updates)
        return updates, EmaState(ema, inner_state)

    return optax.GradientTransformationExtraArgs(init, update)


def ema_params(opt_state):
    """The moving average of the parameters inside a run's optimizer state (None: optim.ema is 0)."""
    return opt_state.ema if isinstance(opt_state, EmaState) else None


def spike_state(opt_state) -> SpikeState | None:
    """The SpikeState inside a run's optimizer state (None: optim.skip_spikes is off)."""
    states = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, SpikeState))
              if isinstance(s, SpikeState)]
    return states[0] if states else None


def make(cfg: OptimConfig, total_steps: int, family: str = "gpt2",
         block_scales: Callable[[jax.Array], jax.Array] | None = None,
         n_layer: int | None = None, clock: Callable[[jax.Array], jax.Array] | None = None
         ) -> optax.GradientTransformation:
    """The run's optimizer: AdamW, or with optim.name=muon Muon for the blocks' matrices and AdamW
    for the rest (andrea_jax.train.muon). family: model.family (its decay mask). block_scales: None (the paper's
    AdamW), or step -> [L] factors of the blocks' updates (scale_block_updates; `update` then
    needs step=): prores.scale_updates's factor times model.depth_param's hidden-LR factor, as
    andrea_jax.train.steps makes them. n_layer: model.n_layer, needed with optim.skip_spikes (`update` then needs
    loss=). clock: None (the schedules count updates), or count -> the ramp's clock they read (on_clock)."""
    adamw = optax.adamw(on_clock(lr_schedule(cfg, total_steps), clock), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                        weight_decay=cfg.weight_decay, mask=functools.partial(decay_mask, family=family))
    if cfg.name == "muon":
        adamw = muon.muon_and_adamw(on_clock(lr_schedule(cfg, total_steps, cfg.muon_lr), clock), cfg.muon_momentum,
                                    cfg.muon_weight_decay, adamw)
    adamw = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), adamw)
    if block_scales is not None:
        adamw = scale_block_updates(adamw, block_scales)
    if cfg.skip_spikes:
        if n_layer is None:
            raise ValueError("optim.skip_spikes: make() needs n_layer (it keeps per-block gradient norms)")
        adamw = skip_loss_spikes(adamw, cfg.skip_spikes, cfg.skip_spikes_window, n_layer)
    # Always wrapped, so the optimizer state has one structure and skip_nonfinite can be switched
    # on when resuming a run that hit a NaN. Off, a limit of 0 skipped updates applies every
    # update unchanged (the guard only counts); on, no non-finite update is ever applied: the
    # trainer stops a run stuck for optim.max_consecutive_skips updates instead.
    limit = int(jnp.iinfo(jnp.int32).max) if cfg.skip_nonfinite else 0
    guarded = optax.apply_if_finite(adamw, max_consecutive_errors=limit)
    return params_ema(guarded, cfg.ema) if cfg.ema else guarded


def _guard_state(opt_state) -> optax.ApplyIfFiniteState:
    states = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, optax.ApplyIfFiniteState))
              if isinstance(s, optax.ApplyIfFiniteState)]
    if len(states) != 1:
        raise ValueError(f"expected one apply_if_finite state in the optimizer state, found {len(states)}")
    return states[0]


def skip_counts(opt_state) -> dict:
    """On-device int32 scalars: `skipped_updates` (non-finite gradients so far) and
    `skipped_in_a_row` (those since the last finite one)."""
    guard = _guard_state(opt_state)
    return {"skipped_updates": guard.total_notfinite, "skipped_in_a_row": guard.notfinite_count}
