"""Populations of small models: N members of one model shape trained by one vmapped, jitted step.

The parameters and the optimizer state carry a leading member axis [N]; the settings that may
differ between members (PER_MEMBER: the init seed, the peak LR, its warmup, the weight decay,
ProRes's T, its update scaling and whether its forward pass uses the alphas) are arrays in the
state, so the step is one program whatever their values. Everything else is structural and must
be the same for every member (member_configs and check_structure refuse a difference, naming the
setting). Every member reads the same batch.

A member computes what a solo run of its config computes (steps.create_state and
steps.make_train_step): the same forward, loss and gradients (steps.objective), and the same
optimizer, rebuilt around traced settings: optim.lr_schedule's formulas as jnp functions of the
member's peak and warmup, and prores's alphas at the member's T. Its optimizer state has the
solo run's tree, so member i's slice is a solo state's contents.

A member whose loss or update is not finite is frozen from that step on: its params, optimizer
state and step stay as they were, and the vmap keeps its neighbours' arithmetic apart.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import NamedSharding, PartitionSpec as P

from andrea_jax import config as config_lib, model as model_lib
from andrea_jax.config import UPDATE_SCALES, Config
from andrea_jax.errors import ConfigError
from andrea_jax.model import depth, prores
from andrea_jax.train import diagnostics as diag_lib, optim, sharding, steps

PER_MEMBER = ("train.seed", "optim.lr", "optim.warmup_steps", "optim.weight_decay", "prores.warmup",
              "prores.scale_updates", "prores.forward")


class MemberSettings(NamedTuple):
    """The per-member settings, each an array [N] (inside the vmapped step: a scalar)."""
    seed: jax.Array           # int32: train.seed, the init key's seed
    lr: jax.Array             # float32: optim.lr, the peak
    warmup_steps: jax.Array   # int32: optim.warmup_steps
    weight_decay: jax.Array   # float32: optim.weight_decay
    prores_warmup: jax.Array  # int32: prores.warmup, T
    scale_mode: jax.Array     # int32: prores.scale_updates as its index in UPDATE_SCALES
    forward: jax.Array        # bool: prores.forward


@struct.dataclass
class PopulationState:
    """N members' train states, stacked: every leaf has a leading member axis [N]."""
    step: jax.Array      # int32 [N]: each member's completed updates (a frozen member's stops)
    params: dict
    opt_state: optax.OptState
    settings: MemberSettings
    frozen: jax.Array    # bool [N]: the member met a non-finite loss or update and no longer moves


def _get(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _with(cfg: Config, key: str, value) -> Config:
    section, name = key.split(".")
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{name: value})})


def _first_difference(a: Config, b: Config) -> str:
    for section in dataclasses.fields(a):
        for field in dataclasses.fields(getattr(a, section.name)):
            key = f"{section.name}.{field.name}"
            if _get(a, key) != _get(b, key):
                return key
    raise AssertionError("configs differ in no field")


def check_structure(cfgs: list[Config]) -> None:
    """Raises ConfigError naming the first setting, outside PER_MEMBER, on which a member differs
    from member 0, or one a population does not support."""
    if not cfgs:
        raise ConfigError("population: no members")
    first = cfgs[0]
    if first.optim.name != "adamw":
        raise ConfigError(f"optim.name: a population trains AdamW members, not {first.optim.name}")
    on_tokens = [k for k in ("train.batch_ramp", "model.seq_len_ramp", "prores.warmup_tokens") if _get(first, k)]
    if on_tokens:  # its traced schedules count steps
        raise ConfigError(f"{on_tokens[0]}: a population's schedules count steps, not tokens; it takes no ramp "
                          "and no prores.warmup_tokens")
    for i, cfg in enumerate(cfgs[1:], start=1):
        aligned = functools.reduce(lambda c, key: _with(c, key, _get(first, key)), PER_MEMBER, cfg)
        if aligned != first:
            key = _first_difference(aligned, first)
            raise ConfigError(f"{key}: every member of a population must have the same; member {i} has "
                              f"{_get(cfg, key)!r}, member 0 {_get(first, key)!r}")
        # Members read one batch stream, so the data order is shared even where train.seed is not.
        if cfg.train.order_seed != first.train.order_seed:
            raise ConfigError(f"train.data_seed: members read one batch stream; member {i}'s data order seed "
                              f"{cfg.train.order_seed} differs from member 0's {first.train.order_seed}: "
                              "set train.data_seed")


def member_configs(base: Config, overrides: list[list[str]]) -> list[Config]:
    """One validated config per member: `base` with that member's `section.key=value` overrides."""
    cfgs = [config_lib.validate(config_lib.override(base, member)) for member in overrides]
    check_structure(cfgs)
    return cfgs


def member_settings(cfgs: list[Config]) -> MemberSettings:
    """The members' PER_MEMBER settings as arrays [N]."""
    column = lambda key, dtype: jnp.asarray([_get(c, key) for c in cfgs], dtype)
    return MemberSettings(
        seed=column("train.seed", jnp.int32), lr=column("optim.lr", jnp.float32),
        warmup_steps=column("optim.warmup_steps", jnp.int32),
        weight_decay=column("optim.weight_decay", jnp.float32),
        prores_warmup=column("prores.warmup", jnp.int32),
        scale_mode=jnp.asarray([UPDATE_SCALES.index(c.prores.scale_updates) for c in cfgs], jnp.int32),
        forward=column("prores.forward", jnp.bool_))


def _linear(start, end, count, span):
    """optax.linear_schedule's value at `count` over `span` >= 1 steps, with traced ends and span."""
    frac = 1 - jnp.clip(count, 0, span) / span
    return (start - end) * frac + end


def lr_at(cfg: Config, peak, warmup, step) -> jax.Array:
    """optim.lr_schedule(cfg.optim, cfg.train.steps) at `step`, with a traced peak and warmup: the
    same formulas as the optax schedules it joins, whose Python-int spans cannot be traced."""
    total, o = cfg.train.steps, cfg.optim
    w = jnp.minimum(warmup, total)
    if o.schedule == "cosine":
        decay = jnp.maximum(total, w + 1) - w
        count = jnp.minimum((step - w).astype(jnp.float32), decay.astype(jnp.float32))
        cosine = (1 - o.min_lr_ratio) * (0.5 * (1 + jnp.cos(jnp.pi * count / decay))) + o.min_lr_ratio
        return jnp.where(step < w, _linear(0.0, peak, step, jnp.maximum(w, 1)), peak * cosine)
    if o.schedule == "wsd":
        decay = min(o.decay_steps, total) or max(1, int(round(total * o.decay_fraction)))
        stable = jnp.maximum(0, total - w - decay)
        ramp = _linear(0.0, peak, step, jnp.maximum(w, 1))
        out = jnp.where(step < w, ramp, peak)
        return jnp.where(step < w + stable, out, _linear(peak, 0.0, step - (w + stable), decay))
    raise ConfigError(f"optim.schedule: unknown LR schedule {o.schedule!r}")


def schedule_alphas(cfg: Config, warmup, step) -> jax.Array:
    """prores.schedule_alphas at a traced T: every schedule is a function of step / T (the fixed
    ones of neither), so prores's own formulas run at T = 1 on step / T; T = 0 is prores's case."""
    L, kind = cfg.model.n_layer, cfg.prores.schedule
    T = jnp.asarray(warmup, jnp.float32)
    ramped = prores.alphas(jnp.asarray(step, jnp.float32) / jnp.maximum(T, 1.0), L, schedule=kind, warmup=1)
    return jnp.where(T == 0, prores.alphas(step, L, schedule=kind, warmup=0), ramped)


def run_alphas(cfg: Config, s: MemberSettings, step) -> jax.Array:
    """prores.run_alphas of the member: its schedule's alphas, all ones where forward is false."""
    alphas_L = jnp.where(s.forward, schedule_alphas(cfg, s.prores_warmup, step), 1.0)
    return alphas_L * jnp.float32(depth.branch_multiplier(cfg.model))


def update_scales(cfg: Config, s: MemberSettings, step) -> jax.Array:
    """steps' block update factors of the member: prores.update_scales's factor, picked by the
    member's mode, times model.depth_param's hidden-LR factor. Mode `none` multiplies by exact ones."""
    a_L = schedule_alphas(cfg, s.prores_warmup, step)
    by_mode_ML = jnp.stack([jnp.ones_like(a_L), a_L, jnp.sqrt(a_L), jnp.square(a_L)])  # UPDATE_SCALES' order
    return by_mode_ML[s.scale_mode] * jnp.float32(depth.hidden_lr_scale(cfg.model))


def member_tx(cfg: Config, s: MemberSettings) -> optax.GradientTransformation:
    """optim.make's AdamW chain for one member with its traced settings, in the same wrappers, so
    its state has a solo run's tree. Scaling is always on: a `none` member's factors are ones."""
    o = cfg.optim
    mask = functools.partial(optim.decay_mask, family=cfg.model.family)
    adamw = optax.adamw(lambda count: lr_at(cfg, s.lr, s.warmup_steps, count), b1=o.b1, b2=o.b2,
                        eps=o.eps * depth.eps_scale(cfg.model), weight_decay=s.weight_decay, mask=mask)
    tx = optim.scale_block_updates(optax.chain(optax.clip_by_global_norm(o.clip_norm), adamw),
                                   lambda step: update_scales(cfg, s, step))
    if o.skip_spikes:
        tx = optim.skip_loss_spikes(tx, o.skip_spikes, o.skip_spikes_window, cfg.model.n_layer)
    limit = int(jnp.iinfo(jnp.int32).max) if o.skip_nonfinite else 0
    guarded = optax.apply_if_finite(tx, max_consecutive_errors=limit)
    return optim.params_ema(guarded, o.ema) if o.ema else guarded


def _member_init(cfg: Config, s: MemberSettings):
    params = model_lib.init(cfg.model, jax.random.key(s.seed), cfg.kernels.impl)["params"]
    return params, member_tx(cfg, s).init(params)


def state_shardings(cfg: Config, mesh: jax.sharding.Mesh) -> PopulationState:
    """A solo state's shardings with the member axis unsplit in front; step, settings and flags
    replicated."""
    solo = steps.state_shardings(cfg, mesh)
    stacked = lambda sh: NamedSharding(mesh, P(None, *sh.spec))
    replicated = NamedSharding(mesh, P())
    return PopulationState(step=replicated, params=jax.tree.map(stacked, solo.params),
                           opt_state=jax.tree.map(stacked, solo.opt_state),
                           settings=MemberSettings(*(replicated,) * len(MemberSettings._fields)),
                           frozen=replicated)


def _init_fn(cfg: Config, n: int):
    """settings [N] -> the members' fresh PopulationState (vmapped _member_init)."""
    def init(s: MemberSettings) -> PopulationState:
        params, opt_state = jax.vmap(functools.partial(_member_init, cfg))(s)
        return PopulationState(step=jnp.zeros((n,), jnp.int32), params=params, opt_state=opt_state,
                               settings=s, frozen=jnp.zeros((n,), jnp.bool_))
    return init


def create_states(cfgs: list[Config], mesh: jax.sharding.Mesh) -> PopulationState:
    """The members' fresh states, stacked, each initialised from its own train.seed as a solo run's
    (steps.create_state with jax.random.key(train.seed)); one jitted, vmapped init."""
    check_structure(cfgs)
    sharding.check(cfgs[0], mesh)
    return jax.jit(_init_fn(cfgs[0], len(cfgs)), out_shardings=state_shardings(cfgs[0], mesh))(member_settings(cfgs))


def abstract_state(cfgs: list[Config], mesh: jax.sharding.Mesh) -> PopulationState:
    """The members' state as ShapeDtypeStructs carrying their shardings: allocates nothing (andrea_jax.aot)."""
    check_structure(cfgs)
    shapes = jax.eval_shape(_init_fn(cfgs[0], len(cfgs)), member_settings(cfgs))
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes,
                        state_shardings(cfgs[0], mesh))


def _all_finite(tree) -> jax.Array:
    return jnp.all(jnp.asarray([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def _member_step(cfg: Config, grad_fn, with_diagnostics: bool, params, opt_state, step, s: MemberSettings, frozen,
                 tokens_BT1):
    """One member's update (steps.make_train_step's, at the member's settings), kept only while the
    member's loss and updates are finite; after the first that is not, the member stays frozen."""
    (loss, aux), grads = grad_fn(params, tokens_BT1, run_alphas(cfg, s, step))
    updates, new_opt_state = member_tx(cfg, s).update(grads, opt_state, params, step=step, loss=loss)
    frozen = frozen | ~(jnp.isfinite(loss) & _all_finite(updates))
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(frozen, o, n), new, old)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), "lr": lr_at(cfg, s.lr, s.warmup_steps, step),
               "frozen": frozen}
    if aux["z_loss"] is not None:
        metrics["z_loss"] = aux["z_loss"]
    if (spikes := optim.spike_state(new_opt_state)) is not None:
        metrics["skipped_spikes"] = spikes.skipped
    new_params = keep(optax.apply_updates(params, updates), params)
    if with_diagnostics:
        metrics |= {**aux["stats"], "layer_grad_norm": diag_lib.layer_norms(grads["blocks"]),
                    "update_ratio": diag_lib.update_ratios(new_params["blocks"], params["blocks"])}
    return new_params, keep(new_opt_state, opt_state), jnp.where(frozen, step, step + 1), frozen, metrics


def make_train_step(cfgs: list[Config], mesh: jax.sharding.Mesh, *, with_diagnostics: bool = False, eot_id: int = 0):
    """The jitted population update: (PopulationState, tokens_BT1) -> (PopulationState, metrics),
    every metric [N] (loss, grad_norm, lr, frozen; z_loss, skipped_spikes as the solo step's), and
    `with_diagnostics` each member's per-layer statistics [N, L] as steps.make_train_step's.
    The batch is shared by the members; the old state is donated. eot_id: as steps.make_train_step's."""
    check_structure(cfgs)
    cfg = cfgs[0]
    sharding.check(cfg, mesh)
    model = steps.loss_model(cfg, diagnostics=with_diagnostics)
    param_sh = steps.state_shardings(cfg, mesh).params
    eot = eot_id if cfg.data.document_mask else None

    def grad_fn(params, tokens_BT1, alphas_L):
        def one(p, tokens):
            (_, (loss, aux)), grads = jax.value_and_grad(steps.objective, has_aux=True)(
                p, model, tokens, alphas_L, cfg.optim.z_loss, eot)
            return (loss, aux), grads
        return steps._microbatched(one, cfg, mesh, param_sh)(params, tokens_BT1)

    def train_step(state: PopulationState, tokens_BT1):
        member = functools.partial(_member_step, cfg, grad_fn, with_diagnostics)
        params, opt_state, step, frozen, metrics = jax.vmap(member, in_axes=(0, 0, 0, 0, 0, None))(
            state.params, state.opt_state, state.step, state.settings, state.frozen, tokens_BT1)
        return state.replace(step=step, params=params, opt_state=opt_state, frozen=frozen), metrics

    pop_sh = state_shardings(cfg, mesh)
    replicated = NamedSharding(mesh, P())
    return jax.jit(steps._in_layout(cfg, mesh, train_step), in_shardings=(pop_sh, steps.batch_sharding(cfg, mesh)),
                   out_shardings=(pop_sh, replicated), donate_argnums=0)


def member(state: PopulationState, i: int):
    """Member i's (step, params, opt_state): the contents of its solo TrainState."""
    take = lambda tree: jax.tree.map(lambda x: x[i], tree)
    return state.step[i], take(state.params), take(state.opt_state)
