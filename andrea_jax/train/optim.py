"""AdamW with global-norm clipping and the learning-rate schedules, all from optax, behind a
finiteness guard that can skip an update whose gradient is not finite (optim.skip_nonfinite)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from andrea_jax.config import OptimConfig


def lr_schedule(cfg: OptimConfig, total_steps: int) -> optax.Schedule:
    warmup = min(cfg.warmup_steps, total_steps)
    if cfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=cfg.lr, warmup_steps=warmup,
            decay_steps=max(total_steps, warmup + 1), end_value=cfg.lr * cfg.min_lr_ratio)
    if cfg.schedule == "wsd":
        decay = max(1, int(round(total_steps * cfg.decay_fraction)))
        stable = max(0, total_steps - warmup - decay)
        return optax.join_schedules(
            [optax.linear_schedule(0.0, cfg.lr, max(warmup, 1)),
             optax.constant_schedule(cfg.lr),
             optax.linear_schedule(cfg.lr, 0.0, decay)],
            boundaries=[warmup, warmup + stable])
    raise ValueError(f"unknown LR schedule {cfg.schedule!r}")


def _names(path) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", k)) for k in path)


def decay_mask(params, family: str = "gpt2"):
    """Which parameters weight decay applies to, by model.family.

    gpt2: matrices only: kernels and embeddings, never biases, LayerNorm gains or the scalar
    residual gates. llama (the official ProRes code's AdamW groups): the linears and the head (all
    `*kernel`s) and the final norm's gain, not the token embedding, the blocks' norm gains or the
    gates."""
    if family not in ("gpt2", "llama"):
        raise ValueError(f"unknown model.family {family!r}")

    def decays(path, _):
        names = _names(path)
        if family == "llama":
            return names[-1].endswith("kernel") or names == ("lnf_scale",)
        return names[-1].endswith(("kernel", "embedding"))
    return jax.tree_util.tree_map_with_path(decays, params)


def make(cfg: OptimConfig, total_steps: int, family: str = "gpt2") -> optax.GradientTransformation:
    mask = decay_mask if family == "gpt2" else functools.partial(decay_mask, family=family)
    adamw = optax.chain(
        optax.clip_by_global_norm(cfg.clip_norm),
        optax.adamw(lr_schedule(cfg, total_steps), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                    weight_decay=cfg.weight_decay, mask=mask),
    )
    # Always wrapped, so the optimizer state has one structure and skip_nonfinite can be switched
    # on when resuming a run that hit a NaN. Off, a limit of 0 skipped updates applies every
    # update unchanged (the guard only counts); on, no non-finite update is ever applied: the
    # trainer stops a run stuck for optim.max_consecutive_skips updates instead.
    limit = int(jnp.iinfo(jnp.int32).max) if cfg.skip_nonfinite else 0
    return optax.apply_if_finite(adamw, max_consecutive_errors=limit)


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
