"""Statistics of the reproduction: seed summaries, paired bootstrap intervals, the unigram
plateau and the escape rate. Pure numpy functions of plain numbers."""
from __future__ import annotations

import math

import numpy as np


def describe(values) -> dict:
    """n, mean, sample std, min, max of the finite values (NaN = a run that did not finish)."""
    v = np.array([x for x in values if x is not None and math.isfinite(x)], float)
    if not len(v):
        return {"n": 0, "mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan}
    return {"n": int(len(v)), "mean": float(v.mean()), "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
            "min": float(v.min()), "max": float(v.max())}


def paired_differences(arm: dict, baseline: dict) -> dict:
    """{seed: arm[seed] - baseline[seed]} over the seeds where both are finite (same seed = same
    init and data order, so the difference removes what the seed does to both)."""
    return {s: arm[s] - baseline[s] for s in sorted(set(arm) & set(baseline))
            if math.isfinite(arm[s]) and math.isfinite(baseline[s])}


def bootstrap_ci(diffs, *, level: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> dict:
    """Mean of the paired differences and its percentile-bootstrap interval (seeds resampled with
    replacement). With n seeds there are only C(2n-1, n) distinct resamples (10 for n = 3), so the
    interval is coarse and too narrow for small n; `n` says how many pairs it rests on."""
    d = np.asarray(list(diffs), float)
    if not len(d):
        return {"n": 0, "mean": math.nan, "lo": math.nan, "hi": math.nan}
    means = np.random.default_rng(seed).choice(d, size=(n_boot, len(d)), replace=True).mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return {"n": int(len(d)), "mean": float(d.mean()), "lo": float(lo), "hi": float(hi)}


def direction(ci: dict) -> str:
    """'lower' / 'higher' when the interval excludes 0, 'unresolved' when it straddles it."""
    if not ci["n"]:
        return "no pairs"
    if ci["hi"] < 0:
        return "lower"
    if ci["lo"] > 0:
        return "higher"
    return "unresolved"


def unigram_cross_entropy(train_ids, val_ids, vocab_size: int) -> dict:
    """The plateau a model reaches by learning only token frequencies: the entropy of the training
    tokens' unigram distribution and the cross-entropy of the validation tokens under it (add-one
    smoothed, so an unseen token costs a finite amount), in nats/token."""
    counts = np.bincount(np.asarray(train_ids, np.int64), minlength=vocab_size).astype(float)
    p_train = counts / counts.sum()
    nz = p_train[p_train > 0]
    q = (counts + 1.0) / (counts.sum() + vocab_size)
    val = np.asarray(val_ids, np.int64)
    return {"train_entropy": float(-(nz * np.log(nz)).sum()), "val_cross_entropy": float(-np.log(q[val]).mean())}


def escape(final_losses, plateau: float, margin: float) -> dict:
    """Runs whose final validation loss is below the unigram plateau minus `margin`. A run that
    did not finish (NaN: diverged or failed) has not escaped."""
    losses = list(final_losses)
    k = sum(1 for x in losses if x is not None and math.isfinite(x) and x < plateau - margin)
    return {"escaped": k, "runs": len(losses), "rate": k / len(losses) if losses else math.nan,
            "threshold": plateau - margin}
