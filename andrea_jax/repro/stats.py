"""Statistics of the reproduction: seed summaries, paired-t intervals, exact sign-flip p-values,
paired bootstrap intervals, the unigram plateau and the escape rate. Pure numpy functions of plain
numbers."""
from __future__ import annotations

import itertools
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


def t_cdf_central(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with an integer df >= 1, in closed form (Abramowitz & Stegun
    26.7.3-4): a finite series in cos(theta), theta = atan(t / sqrt(df)); no scipy in the core install."""
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, term, total = math.cos(theta) ** 2, 1.0, 1.0
    if df % 2:  # odd: (2 / pi) (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        series = math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0
        return 2.0 / math.pi * (theta + series)
    for k in range(1, df // 2):  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


def t_quantile(prob: float, df: int) -> float:
    """The prob-quantile (prob > 0.5) of Student's t with integer df, by bisection on the exact
    central CDF to float precision."""
    level = 2.0 * prob - 1.0
    lo, hi = 0.0, 1.0
    while t_cdf_central(hi, df) < level:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if t_cdf_central(mid, df) < level else (lo, mid)
    return 0.5 * (lo + hi)


def paired_t(diffs, *, level: float = 0.95) -> dict:
    """Mean of the paired differences and its paired-t interval, mean +- t_{(1+level)/2, n-1} sd / sqrt(n)
    (NaN bounds below 2 pairs)."""
    d = np.asarray(list(diffs), float)
    n = len(d)
    if n < 2:
        return {"n": n, "mean": float(d.mean()) if n else math.nan, "t_lo": math.nan, "t_hi": math.nan}
    half = t_quantile((1 + level) / 2, n - 1) * float(d.std(ddof=1)) / math.sqrt(n)
    return {"n": n, "mean": float(d.mean()), "t_lo": float(d.mean() - half), "t_hi": float(d.mean() + half)}


def sign_flip_p(diffs) -> dict:
    """Exact two-sided sign-flip (permutation) p-value of the mean paired difference: the fraction of
    the 2^n sign assignments whose |mean| is at least the observed one, ties included, and the
    smallest p that n pairs allow (2 / 2^n: only the two all-same-sign flips reach the observed)."""
    d = np.asarray(list(diffs), float)
    n = len(d)
    if not n:
        return {"p": math.nan, "p_min": math.nan}
    if n > 20:
        raise ValueError(f"exact sign-flip enumeration of {n} pairs (2^{n} flips) is too large")
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
    means = np.abs(signs @ d) / n
    # A flip that reorders the same terms can land one rounding error below the observed |mean|:
    # it is a tie, and ties count.
    tol = 1e-12 * max(float(np.abs(d).max()), 1e-300)
    return {"p": float(np.mean(means >= abs(d.mean()) - tol)), "p_min": min(1.0, 2.0 / 2 ** n)}


def compare(diffs) -> dict:
    """Everything a claim about paired differences needs: n, mean, the paired-t 95% interval, the
    exact sign-flip p and the smallest p n allows, and the percentile bootstrap ([min..max]-like at
    small n) as `lo`/`hi`."""
    d = list(diffs)
    return {**bootstrap_ci(d), **paired_t(d), **sign_flip_p(d)}


def direction(ci: dict) -> str:
    """'lower' / 'higher' when the paired-t interval excludes 0, 'unresolved' when it straddles it
    (or there is one pair, no interval). The bootstrap bounds are not read: at small n they are
    about [min, max] of the pairs and exclude 0 whenever the pairs share a sign."""
    if not ci["n"]:
        return "no pairs"
    if ci["t_hi"] < 0:
        return "lower"
    if ci["t_lo"] > 0:
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
