"""AdamW with global-norm clipping and the learning-rate schedules, all from optax."""
from __future__ import annotations

import jax
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


def decay_mask(params):
    """Weight decay on matrices only: kernels and embeddings, never biases or LayerNorm gains."""
    def is_matrix(path, _):
        name = str(getattr(path[-1], "key", path[-1]))
        return name.endswith(("kernel", "embedding"))
    return jax.tree_util.tree_map_with_path(is_matrix, params)


def make(cfg: OptimConfig, total_steps: int) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(cfg.clip_norm),
        optax.adamw(lr_schedule(cfg, total_steps), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                    weight_decay=cfg.weight_decay, mask=decay_mask),
    )
