"""Compute-ladder fits: L(C) = E + A C^(-alpha) of final losses against training FLOPs, bootstrap
intervals over seeds, and the effective compute multiplier of an arm against a baseline. Numpy only
(scipy is a test dependency, not the package's).

For a fixed alpha the law is linear in E and A, so least squares gives them in closed form and the
sum of squares becomes a function of alpha alone. A grid over log alpha finds its basin and a
golden-section search between the best grid point's neighbours refines it, never leaving that
bracket. A is fitted as a = A c_ref^(-alpha), the loss above E at c_ref, the geometric mean of the
measured compute, so that no intermediate is of order C^alpha (A itself can be 1e30 at alpha = 3).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

ALPHAS = np.geomspace(1e-3, 10.0, 401)  # the grid's ends: flags an alpha the data do not bound
GOLDEN = (math.sqrt(5) - 1) / 2
LEVEL = 0.95                            # every interval's coverage


@dataclasses.dataclass(frozen=True)
class Law:
    E: float
    a: float                 # the loss above E at c_ref
    alpha: float
    c_ref: float
    at_bound: bool = False   # the best alpha is an end of ALPHAS: the data do not determine it

    @property
    def A(self) -> float:
        return self.a * self.c_ref ** self.alpha

    @property
    def ok(self) -> bool:
        return math.isfinite(self.alpha)

    def loss(self, C):
        return self.E + self.a * (np.asarray(C, float) / self.c_ref) ** -self.alpha

    def compute(self, L):
        """The compute at which this law reaches loss L; inf at or below E (it never does), nan without a law."""
        gap = np.asarray(L, float) - self.E
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            reached = self.c_ref * (self.a / np.where(gap > 0, gap, 1.0)) ** (1.0 / self.alpha)
        return np.where(np.isnan(gap), np.nan, np.where(gap > 0, reached, np.inf))


NO_LAW = Law(math.nan, math.nan, math.nan, math.nan)


def _linear(log_x, y, alphas):
    """(E, a, sum of squares) per alpha of least squares y = E + a x^-alpha; the sum is inf where
    a <= 0 (a loss that does not fall with compute is no law of this form)."""
    z = np.exp(-np.asarray(alphas, float)[:, None] * log_x[None, :])
    zc, yc = z - z.mean(axis=1, keepdims=True), y - y.mean()
    a = (zc @ yc) / np.einsum("gn,gn->g", zc, zc)
    resid = yc[None, :] - a[:, None] * zc  # E = mean(y) - a mean(z) absorbs the means
    sse = np.einsum("gn,gn->g", resid, resid)
    return y.mean() - a * z.mean(axis=1), a, np.where((a > 0) & np.isfinite(sse), sse, np.inf)


def _sum_of_squares(log_x, y):
    """_linear's sum of squares as a function of log alpha, lean: the refinement calls it 40 times a fit."""
    yc = y - y.mean()

    def at(log_alpha: float) -> float:
        zc = np.exp(-math.exp(log_alpha) * log_x)
        zc -= zc.mean()
        a = (zc @ yc) / (zc @ zc)
        resid = yc - a * zc
        return float(resid @ resid) if a > 0 else math.inf
    return at


def _golden(f, lo: float, hi: float, iterations: int = 40) -> float:
    """The minimiser of a unimodal f on [lo, hi]."""
    c, d = hi - GOLDEN * (hi - lo), lo + GOLDEN * (hi - lo)
    fc, fd = f(c), f(d)
    for _ in range(iterations):
        if fc <= fd:
            hi, d, fd = d, c, fc
            c = hi - GOLDEN * (hi - lo)
            fc = f(c)
        else:
            lo, c, fc = c, d, fd
            d = lo + GOLDEN * (hi - lo)
            fd = f(d)
    return (lo + hi) / 2


def fit_law(C, L, alphas=ALPHAS) -> Law:
    """The least-squares law through points (C, L); NO_LAW with fewer than 3 distinct C or no
    decreasing law."""
    C, L = np.asarray(C, float), np.asarray(L, float)
    keep = np.isfinite(C) & np.isfinite(L) & (C > 0)
    C, L = C[keep], L[keep]
    if len(np.unique(C)) < 3:
        return NO_LAW
    c_ref = float(np.exp(np.log(C).mean()))
    log_x = np.log(C / c_ref)
    sse = _linear(log_x, L, alphas)[2]
    best = int(np.argmin(sse))
    if not np.isfinite(sse[best]):
        return NO_LAW
    lo, hi = np.log(alphas[max(best - 1, 0)]), np.log(alphas[min(best + 1, len(alphas) - 1)])
    log_alpha = _golden(_sum_of_squares(log_x, L), lo, hi)
    alpha = math.exp(log_alpha) if _linear(log_x, L, [math.exp(log_alpha)])[2][0] <= sse[best] else alphas[best]
    E, a, _ = _linear(log_x, L, [alpha])
    return Law(float(E[0]), float(a[0]), float(alpha), c_ref, at_bound=best in (0, len(alphas) - 1))


def multiplier(base: Law, arm: Law, C):
    """The effective compute multiplier of `arm` at compute C: the compute the baseline's law needs
    to reach the arm's loss at C, over C (inf where the arm's loss is at or below the baseline's E)."""
    C = np.asarray(C, float)
    return base.compute(arm.loss(C)) / C


def interval(values, level: float = LEVEL) -> tuple[float, float]:
    """The percentile interval of bootstrap values, failed fits (nan) left out; inf counts."""
    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    if not len(v):
        return math.nan, math.nan
    lo, hi = np.quantile(v, [(1 - level) / 2, (1 + level) / 2], method="nearest")
    return float(lo), float(hi)


def points(runs: dict, drawn: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(C, L) of an arm's runs {rung: {seed: (C, L)}}; drawn: {rung: [seed, ...]} picks (and
    repeats) seeds, as a bootstrap draw does."""
    pairs = [runs[r][s] for r in runs for s in (sorted(runs[r]) if drawn is None else drawn.get(r, ()))
             if s in runs[r]]
    return np.array([p[0] for p in pairs], float), np.array([p[1] for p in pairs], float)


def bootstrap(data: dict, draws: int, seed: int = 0) -> list[dict]:
    """`draws` refits of every arm of data {arm: {rung: {seed: (C, L)}}}, each on seeds drawn with
    replacement within every rung. All arms of a draw get the same seed labels: arms stay paired by
    seed, as the runs are (a seed fixes the init and the data order)."""
    rng = np.random.default_rng(seed)
    rungs = sorted({r for runs in data.values() for r in runs})
    labels = {r: sorted({s for runs in data.values() for s in runs.get(r, {})}) for r in rungs}
    out = []
    for _ in range(draws):
        drawn = {r: [labels[r][i] for i in rng.integers(0, len(labels[r]), len(labels[r]))] for r in rungs}
        out.append({arm: fit_law(*points(runs, drawn)) for arm, runs in data.items()})
    return out


def _law_summary(law: Law, refits: list, C, L) -> dict:
    resid = L - law.loss(C) if law.ok else np.full(len(L), math.nan)
    row = {"n_points": int(len(L)), "c_ref": law.c_ref, "at_bound": law.at_bound,
           "rms_residual": float(np.sqrt(np.mean(resid ** 2))) if len(L) else math.nan,
           "draws_fitted": sum(r.ok for r in refits), "draws": len(refits)}
    for name in ("E", "A", "alpha"):
        row[name] = float(getattr(law, name))
        row[f"{name}_interval"] = interval([getattr(r, name) for r in refits])
    return row


def ladder(data: dict, baseline: str, draws: int = 1000, seed: int = 0, curve_points: int = 41) -> dict:
    """Every arm's law with bootstrap intervals and, for each arm but the baseline, its multiplier at
    each of its rungs' compute with an interval, flagged `extrapolated` where the baseline's law is
    read outside the compute its own runs span; `curve`: the same over a grid spanning every run's
    compute. data: {arm: {rung: {seed: (C, L)}}}."""
    laws = {arm: fit_law(*points(runs)) for arm, runs in data.items()}
    refits = bootstrap(data, draws, seed)
    base_C = points(data.get(baseline, {}))[0]
    measured = (float(base_C.min()), float(base_C.max())) if len(base_C) else (math.nan, math.nan)
    every_C = np.concatenate([points(runs)[0] for runs in data.values()] or [np.zeros(0)])
    grid = np.geomspace(every_C.min(), every_C.max(), curve_points) if len(every_C) else np.zeros(0)
    out = {"baseline": baseline, "draws": draws, "level": LEVEL, "baseline_compute": list(measured), "arms": {}}
    for arm, runs in data.items():
        C, L = points(runs)
        row = {"fit": _law_summary(laws[arm], [r[arm] for r in refits], C, L), "rungs": {}}
        compared = arm != baseline and baseline in laws
        for rung, by_seed in runs.items():
            rung_C, rung_L = points({rung: by_seed})
            c = float(rung_C.mean())
            entry = {"compute": c, "losses": rung_L.tolist(), "fitted_loss": float(laws[arm].loss(c))}
            if compared:
                entry |= _compared(laws, refits, baseline, arm, [c], measured)[0]
            row["rungs"][rung] = entry
        if compared:
            along = _compared(laws, refits, baseline, arm, grid, measured)
            row["curve"] = {"compute": grid.tolist(),
                            **{k: [e[k] for e in along] for k in ("multiplier", "multiplier_interval", "extrapolated")}}
        out["arms"][arm] = row
    return out


def _compared(laws: dict, refits: list, baseline: str, arm: str, computes, measured) -> list[dict]:
    """The arm's multiplier at each of `computes`, its interval over the refits, the compute the baseline
    needs, and whether that lies outside the baseline's measured range (None where no law fits)."""
    C = np.asarray(computes, float)
    point = multiplier(laws[baseline], laws[arm], C)
    drawn = np.array([multiplier(r[baseline], r[arm], C) for r in refits]).reshape(len(refits), len(C))
    out = []
    for i, c in enumerate(C):
        needed = float(point[i] * c)
        out.append({"multiplier": float(point[i]), "multiplier_interval": interval(drawn[:, i]),
                    "baseline_compute_needed": needed,
                    "extrapolated": None if math.isnan(needed) else not measured[0] <= needed <= measured[1]})
    return out
