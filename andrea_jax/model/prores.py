"""ProRes (Progressive Residual Warmup) schedules: alpha(l, t) for every block l at step t.

Block l (1-indexed) computes x + alpha(l, t) * F(...). t is the number of completed optimizer
updates, so the very first forward pass sees alpha = 0 under every warming schedule. T (`warmup`)
is the first layer's warmup length in steps; a run with a ramp counts both in tokens seen, in
steps of the full shape (andrea_jax.ramps, `schedule_alphas`). Formulas: the ProRes paper's Table 5.
Pure functions of (step, L, T): no flax, no state; jittable with a traced step.
"""
from __future__ import annotations

import jax.numpy as jnp

from andrea_jax import names, ramps
from andrea_jax.config import UPDATE_SCALES, Config
from andrea_jax.model import depth


def _ramp(t, span):
    return jnp.clip(t / span, 0.0, 1.0)


def _warming(formula):
    """A schedule that warms up over T steps: with T = 0 it is fully on from the start."""
    return lambda l, t, L, T: jnp.ones_like(l) if T == 0.0 else formula(l, t, L, T)


def _stagewise(floor):
    """Layer l ramps during [T(l-1), T l], from floor(l, L) to 1."""
    def formula(l, t, L, T):
        m = floor(l, L)
        return jnp.clip(m + (1.0 - m) * (t - T * (l - 1)) / T, m, 1.0)
    return _warming(formula)


# schedule -> alpha(l, t, L, T): l the float32 [L] of 1..L, t the step (float32), L the number of
# blocks and T the warmup, both Python numbers. The config takes these names from names.SCHEDULES.
SCHEDULES = {
    "none": lambda l, t, L, T: jnp.ones_like(l),
    "linear": _warming(lambda l, t, L, T: _ramp(t, T * l)),
    "linear_sqrt": _warming(lambda l, t, L, T: jnp.sqrt(_ramp(t, T * l))),
    "linear_square": _warming(lambda l, t, L, T: jnp.square(_ramp(t, T * l))),
    "equal": _warming(lambda l, t, L, T: jnp.broadcast_to(_ramp(t, T * L), l.shape)),
    "reverse": _warming(lambda l, t, L, T: _ramp(t, T * (L - l + 1))),
    "stagewise_0": _stagewise(lambda l, L: jnp.zeros_like(l)),
    "stagewise_L": _stagewise(lambda l, L: jnp.ones_like(l) / L),
    "stagewise_sqrt_L": _stagewise(lambda l, L: jnp.ones_like(l) / jnp.sqrt(float(L))),
    "stagewise_sqrt_l": _stagewise(lambda l, L: 1.0 / jnp.sqrt(l)),
    "fix_L": lambda l, t, L, T: jnp.ones_like(l) / L,
    "fix_sqrt_L": lambda l, t, L, T: jnp.ones_like(l) / jnp.sqrt(float(L)),
    "fix_sqrt_l": lambda l, t, L, T: 1.0 / jnp.sqrt(l),
}
assert tuple(SCHEDULES) == names.SCHEDULES


def alphas(step, num_layers: int, *, schedule: str = "linear", warmup: int = 1000) -> jnp.ndarray:
    """float32 array [num_layers]: alpha(l, step) for l = 1..num_layers."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown ProRes schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    if warmup < 0:
        raise ValueError(f"ProRes warmup must be >= 0, got {warmup}")
    l = jnp.arange(1, num_layers + 1, dtype=jnp.float32)
    return SCHEDULES[schedule](l, jnp.asarray(step, jnp.float32), num_layers, float(warmup))


def clock_warmup(cfg: Config) -> float:
    """T on the run's clock (andrea_jax.ramps): prores.warmup steps, or prores.warmup_tokens over
    the tokens of one step of the full shape."""
    p = cfg.prores
    return p.warmup_tokens / ramps.full_tokens(cfg) if p.warmup_tokens else p.warmup


def schedule_alphas(cfg: Config, step) -> jnp.ndarray:
    """The schedule's alpha(l, t) of a run of `cfg` after `step` completed steps, t the run's clock
    (the step, or with a ramp the tokens seen: andrea_jax.ramps), whether or not its forward pass
    uses them."""
    return alphas(ramps.clock(cfg, step), cfg.model.n_layer, schedule=cfg.prores.schedule, warmup=clock_warmup(cfg))


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
