"""Training-dynamics diagnostics that are not part of the forward pass: per-layer gradient norms of
the stacked block parameters, per-layer update-to-parameter ratios and the loss-spike score. The
per-layer activation statistics are computed inside the model's scan (`andrea_jax.model.Block`).

Loss-spike score (after OLMo 2, arXiv 2501.00656): the fraction of steps whose loss exceeds the
mean of the previous `window` losses by more than `sigmas` of their standard deviations. Only
upward excursions count (a falling loss is not a spike); steps with fewer than `window`
predecessors are not scored. OLMo 2 uses a window of 1000; the threshold is a parameter.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

PER_LAYER = ("resid_rms", "attn_ratio", "mlp_ratio", "attn_branch_ratio", "mlp_branch_ratio",
             "layer_grad_norm", "update_ratio", "alpha")


def layer_norms(stacked_tree) -> jnp.ndarray:
    """[L]: the global L2 norm of each layer's slice of a tree whose leaves are stacked on axis 0."""
    squares = [jnp.sum(jnp.square(g.astype(jnp.float32)).reshape(g.shape[0], -1), axis=1)
               for g in jax.tree.leaves(stacked_tree)]
    return jnp.sqrt(sum(squares))


def update_ratios(new_stacked_tree, old_stacked_tree) -> jnp.ndarray:
    """[L]: RMS(update of layer l) / RMS(layer l's parameters before it), over all of the layer's
    parameters (equal counts, so the ratio of the L2 norms). Adam's update does not shrink with
    the alpha that scales a block's gradient; this shows it."""
    delta = jax.tree.map(lambda n, o: n.astype(jnp.float32) - o.astype(jnp.float32), new_stacked_tree, old_stacked_tree)
    return layer_norms(delta) / layer_norms(old_stacked_tree)


def spike_flags(losses, window: int, sigmas: float) -> np.ndarray:
    """bool [n]: step i spikes when losses[i] > mean(losses[i-window:i]) + sigmas * std(same).

    A non-finite loss (an update skipped by optim.skip_nonfinite) counts as a spike and is left out
    of the later windows' statistics, so one NaN does not blind the score for the rest of the run."""
    x = np.asarray(losses, np.float64)
    flags = np.zeros(len(x), bool)
    if len(x) <= window:
        return flags
    finite = np.isfinite(x)
    # Rolling sums from cumulative sums, centred on the first finite loss to keep them well conditioned.
    c = np.where(finite, x - (x[finite][0] if finite.any() else 0.0), 0.0)
    s0 = np.concatenate([[0], np.cumsum(finite)])
    s1 = np.concatenate([[0.0], np.cumsum(c)])
    s2 = np.concatenate([[0.0], np.cumsum(c * c)])
    ends = np.arange(window, len(x))
    n = np.maximum(s0[ends] - s0[ends - window], 1)
    mean = (s1[ends] - s1[ends - window]) / n
    var = np.maximum((s2[ends] - s2[ends - window]) / n - mean * mean, 0.0)
    flags[window:] = np.where(finite[window:], c[window:] > mean + sigmas * np.sqrt(var), True)
    return flags


def spike_score(losses, window: int, sigmas: float) -> float:
    """Fraction of the scored steps (those with a full window before them) that spike."""
    n_scored = len(losses) - window
    return float(spike_flags(losses, window, sigmas).sum() / n_scored) if n_scored > 0 else 0.0
