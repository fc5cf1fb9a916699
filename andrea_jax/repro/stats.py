"""Statistics of the reproduction: seed summaries, paired-t intervals, sign-flip p-values (exact up
to 20 pairs, Monte Carlo beyond, and within strata when recipes are pooled), Holm's correction, the
paired equivalence test (TOST), paired bootstrap intervals, the unigram plateau and the escape rate.
Pure numpy functions of plain numbers."""
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


EXACT_FLIPS_MAX_PAIRS = 20   # 2^20 sign assignments; beyond, sign_flip_p samples them


def _flip_p(d, weights, *, n_random: int, seed: int) -> float:
    """Two-sided sign-flip p of the statistic |sum(w_i d_i)|: the share of sign assignments whose
    statistic reaches the observed one, ties included. Exact over all 2^n assignments up to
    EXACT_FLIPS_MAX_PAIRS nonzero pairs; beyond, `n_random` random assignments with the observed one
    counted among them, (1 + hits) / (1 + n_random), which is a valid p (never below the exact one
    on average). An exact zero changes no statistic under a flip, so only nonzero pairs are flipped."""
    keep = d != 0
    wd = (weights * d)[keep]
    n = len(wd)
    observed = abs(float(wd.sum()))
    if not n:
        return 1.0
    # A flip that reorders the same terms can land one rounding error below the observed value:
    # it is a tie, and ties count.
    tol = 1e-12 * max(float(np.abs(wd).sum()), 1e-300)
    if n <= EXACT_FLIPS_MAX_PAIRS:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
        return float(np.mean(np.abs(signs @ wd) >= observed - tol))
    signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(n_random, n))
    hits = int(np.sum(np.abs(signs @ wd) >= observed - tol))
    return (1 + hits) / (1 + n_random)


def sign_flip_p(diffs, *, n_random: int = 100_000, seed: int = 0) -> dict:
    """Two-sided sign-flip (permutation) p-value of the mean paired difference, and the smallest p
    the pairs allow: 2 / 2^k for k nonzero pairs (only the two all-same-sign flips reach the
    observed mean; an exact zero pair flips to itself and adds nothing). Exact enumeration up to 20
    nonzero pairs, Monte Carlo over `n_random` flips beyond."""
    d = np.asarray(list(diffs), float)
    if not len(d):
        return {"p": math.nan, "p_min": math.nan}
    p = _flip_p(d, np.ones_like(d), n_random=n_random, seed=seed)
    return {"p": p, "p_min": min(1.0, 2.0 / 2 ** int(np.count_nonzero(d)))}


def stratified_sign_flip(strata: dict, *, n_random: int = 100_000, seed: int = 0) -> dict:
    """Pooling paired differences of several recipes ({recipe: diffs}) without letting the larger
    one speak for all: the statistic is the mean of the recipes' mean differences (each recipe
    weighs the same, whatever its n), and signs flip within each recipe's pairs. Returns that pooled
    mean, each recipe's mean and n, and the two-sided p (exact up to 20 nonzero pairs in all)."""
    if not strata or any(not len(list(v)) for v in strata.values()):
        raise ValueError(f"stratified_sign_flip needs at least one pair in every stratum, got {strata!r}")
    groups = {name: np.asarray(list(v), float) for name, v in strata.items()}
    d = np.concatenate(list(groups.values()))
    weights = np.concatenate([np.full(len(g), 1.0 / (len(g) * len(groups))) for g in groups.values()])
    return {"mean": float(np.sum(weights * d)),
            "strata": {name: {"n": int(len(g)), "mean": float(g.mean())} for name, g in groups.items()},
            "p": _flip_p(d, weights, n_random=n_random, seed=seed),
            "p_min": min(1.0, 2.0 / 2 ** int(np.count_nonzero(d))),
            "exact": int(np.count_nonzero(d)) <= EXACT_FLIPS_MAX_PAIRS}


def holm(p_values) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: sorted ascending, the i-th smallest
    (from 0) becomes max over j <= i of min(1, (m - j) p_(j)). A hypothesis is rejected at level a
    when its adjusted p is at most a; the family-wise error stays at most a over all m."""
    p = np.asarray(list(p_values), float)
    m = len(p)
    order = np.argsort(p, kind="stable")
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p[i])))
        adjusted[i] = running
    return [float(x) for x in adjusted]


def t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with an integer df, from the exact central CDF."""
    upper = 0.5 * (1.0 - t_cdf_central(t, df))
    return upper if t >= 0 else 1.0 - upper


def tost(diffs, margin: float, *, alpha: float = 0.05) -> dict:
    """The paired equivalence test (two one-sided t tests) of |mean difference| < margin: p is the
    larger of the one-sided p's of "mean <= -margin" and "mean >= +margin", and `equivalent` when it
    is at most alpha, which is the (1 - 2 alpha) paired-t interval lying inside (-margin, +margin).
    "Level" in a reading means this, at a margin stated before the runs."""
    if margin <= 0:
        raise ValueError(f"the equivalence margin must be positive, got {margin}")
    d = np.asarray(list(diffs), float)
    n = len(d)
    if n < 2:
        return {"n": n, "margin": margin, "p": math.nan, "equivalent": False}
    se = float(d.std(ddof=1)) / math.sqrt(n)
    mean = float(d.mean())
    if se == 0.0:
        p = 0.0 if abs(mean) < margin else 1.0
    else:
        p_lower = t_sf((mean + margin) / se, n - 1)        # H0: mean <= -margin
        p_upper = t_sf((margin - mean) / se, n - 1)        # H0: mean >= +margin
        p = max(p_lower, p_upper)
    return {"n": n, "margin": margin, "p": float(p), "equivalent": bool(p <= alpha)}


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
