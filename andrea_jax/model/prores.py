"""ProRes (Progressive Residual Warmup) schedules: alpha(l, t) for every block l at step t.

Block l (1-indexed) computes x + alpha(l, t) * F(...). t is the number of completed optimizer
updates, so the very first forward pass sees alpha = 0 under every warming schedule. T (`warmup`)
is the first layer's warmup length in steps. Formulas: the ProRes paper's Table 5.
Pure functions of (step, L, T): no flax, no state; jittable with a traced step.
"""
from __future__ import annotations

import jax.numpy as jnp

from andrea_jax.config import SCHEDULES, UPDATE_SCALES, Config  # the names; their formulas are below
from andrea_jax.model import depth


def _ramp(t, span):
    return jnp.clip(t / span, 0.0, 1.0)


def alphas(step, num_layers: int, *, schedule: str = "linear", warmup: int = 1000) -> jnp.ndarray:
    """float32 array [num_layers]: alpha(l, step) for l = 1..num_layers."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown ProRes schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    if warmup < 0:
        raise ValueError(f"ProRes warmup must be >= 0, got {warmup}")
    L = num_layers
    l = jnp.arange(1, L + 1, dtype=jnp.float32)
    t = jnp.asarray(step, jnp.float32)
    T = float(warmup)
    ones = jnp.ones((L,), jnp.float32)

    if schedule == "none":
        return ones
    if schedule == "fix_L":
        return ones / L
    if schedule == "fix_sqrt_L":
        return ones / jnp.sqrt(float(L))
    if schedule == "fix_sqrt_l":
        return 1.0 / jnp.sqrt(l)
    if T == 0.0:  # a warmup of zero steps: every warming schedule is fully on from the start
        return ones
    if schedule in ("linear", "linear_sqrt", "linear_square"):
        r = _ramp(t, T * l)
        return {"linear": r, "linear_sqrt": jnp.sqrt(r), "linear_square": r * r}[schedule]
    if schedule == "equal":
        return jnp.broadcast_to(_ramp(t, T * L), (L,))
    if schedule == "reverse":
        return _ramp(t, T * (L - l + 1))
    # Stagewise: layer l ramps during [T(l-1), T l], from a floor m to 1.
    floor = {"stagewise_0": jnp.zeros_like(l), "stagewise_L": ones / L,
             "stagewise_sqrt_L": ones / jnp.sqrt(float(L)), "stagewise_sqrt_l": 1.0 / jnp.sqrt(l)}[schedule]
    return jnp.clip(floor + (1.0 - floor) * (t - T * (l - 1)) / T, floor, 1.0)


def schedule_alphas(cfg: Config, step) -> jnp.ndarray:
    """The schedule's alpha(l, step) of a run of `cfg`, whether or not its forward pass uses them."""
    return alphas(step, cfg.model.n_layer, schedule=cfg.prores.schedule, warmup=cfg.prores.warmup)


def run_alphas(cfg: Config, step) -> jnp.ndarray:
    """What a run of `cfg` multiplies each block's branches by at `step`: the schedule's alphas (all
    ones with prores.forward=false) times model.depth_param's branch multiplier. The one place
    training, inference and export turn a config and a step into alphas."""
    alphas_L = schedule_alphas(cfg, step) if cfg.prores.forward else jnp.ones((cfg.model.n_layer,), jnp.float32)
    multiplier = depth.branch_multiplier(cfg.model)
    return alphas_L if multiplier == 1.0 else alphas_L * jnp.float32(multiplier)


def update_scales(cfg: Config, step) -> jnp.ndarray:
    """float32 [L]: what block l's optimizer update is multiplied by at `step`
    (prores.scale_updates; all ones for `none`, the paper's behaviour). The same step and schedule
    alphas as the forward pass of that update: `schedule_alphas(cfg, step)`, used by the update
    whether or not prores.forward lets the forward pass use them."""
    mode = cfg.prores.scale_updates
    if mode not in UPDATE_SCALES:
        raise ValueError(f"unknown prores.scale_updates {mode!r}; known: {', '.join(UPDATE_SCALES)}")
    if mode == "none":
        return jnp.ones((cfg.model.n_layer,), jnp.float32)
    alphas_L = schedule_alphas(cfg, step)
    return {"alpha": alphas_L, "sqrt_alpha": jnp.sqrt(alphas_L), "alpha_sq": jnp.square(alphas_L)}[mode]
