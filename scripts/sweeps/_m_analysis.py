"""Experiment M's pre-registered analysis (docs/preregistered/M.md, "Analysis"), from the runs' metric
lines: the gap of `linear` and `ramp` to `none` (same seed, width, horizon and evaluation step), its
per-seed slope in ln(t - 480) over the 8000-step runs' evaluations from t = 1000 and in ln(width) over
the final gaps at widths 64, 128 and 192; the four slopes' means, paired-t 95% intervals and exact
sign-flip p's, Holm over the four, each slope's verdict, for a width slope toward the paper the
crossing width with its bootstrap interval, and each part's machine time.

    python scripts/sweeps/_m_analysis.py                    # markdown on standard output
    python scripts/sweeps/_m_analysis.py --width64 corpus2  # the corpus check (docs/m/LOG.md)

A seed whose runs of one slope did not all finish is left out of that slope and counted as lost.

`--width64 corpus2` is exploratory, outside M.md (docs/preregistered/M_exploratory.md): it takes
width 64's runs from mw_w64_corpus2.py, which trains them again on the corpus the widths 128 and 192
train on (docs/m/LOG.md, sitting 20, says why), so that the width slopes can be read with every width
on one corpus.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

import numpy as np

from _l_report import busy_seconds
from _m_choice import SEEDS
from _questions import ROOT

ARMS = ("linear", "ramp")
RAMP_END = 480                        # 24 blocks x T = 20: every block on from this step
HORIZON_STEPS = tuple(range(1000, 8001, 500))
WIDTHS = (64, 128, 192)
RUNS = ROOT / "runs" / "sweeps"
ALPHA = 0.05
N_BOOT = 10_000
PARTS = {"(i) 2000 steps": ("mh_horizon", "mh_horizon", "steps=2000"),
         "(i) 8000 steps": ("mh_horizon", "mh_horizon", "steps=8000"),
         "(ii) LR grids at 128 and 192": ("mw_width_lr", "mw_width_lr"),
         "(ii) widths 128 and 192": ("mw_width", "mw_width")}


def horizon_run(runs: pathlib.Path, arm: str, seed: int, steps: int) -> pathlib.Path:
    return runs / "mh_horizon" / "mh_horizon" / f"steps={steps}" / f"{arm}_s{seed}"


def width_run(runs: pathlib.Path, arm: str, seed: int, w: int, width64: str = "horizon") -> pathlib.Path:
    """Width 64 is the horizon part's 2000-step run (M.md: width 64's runs are (i)'s at 2000 steps),
    or with width64="corpus2" its rerun on the second corpus."""
    if w == WIDTHS[0]:
        if width64 == "corpus2":
            return runs / "mw_w64_corpus2" / "mw_w64_corpus2" / f"{arm}_s{seed}"
        return horizon_run(runs, arm, seed, 2000)
    return runs / "mw_width" / "mw_width" / f"{arm}_w{w}_s{seed}"


def val_losses(run: pathlib.Path) -> dict[int, float] | None:
    """{step: validation loss} of a finished run, or None if it did not finish."""
    result = run / "result.json"
    if not result.is_file() or json.loads(result.read_text()).get("outcome") != "finished":
        return None
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}


def slope(x, y) -> float:
    """Least-squares slope of y on x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    return float(np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2))


def horizon_slope(a: pathlib.Path, b: pathlib.Path) -> float | None:
    """The slope in ln(t - 480) of run a's validation loss minus run b's over t = 1000, 1500, ..., 8000;
    None unless both finished with every one of those evaluations."""
    la, lb = val_losses(a), val_losses(b)
    if la is None or lb is None or any(t not in la or t not in lb for t in HORIZON_STEPS):
        return None
    return slope([math.log(t - RAMP_END) for t in HORIZON_STEPS], [la[t] - lb[t] for t in HORIZON_STEPS])


def horizon_slopes(runs: pathlib.Path, arm: str) -> dict[int, float | None]:
    """{seed: slope of the gap to `none` in ln(t - 480), 8000-step runs}; None for a lost seed."""
    return {seed: horizon_slope(horizon_run(runs, arm, seed, 8000), horizon_run(runs, "none", seed, 8000))
            for seed in SEEDS}


def final_gap(a: pathlib.Path, b: pathlib.Path) -> float | None:
    la, lb = val_losses(a), val_losses(b)
    if la is None or lb is None:
        return None
    last = max(la)
    return la[last] - lb[last] if last in lb else None


def width_gaps(runs: pathlib.Path, arm: str, width64: str = "horizon") -> dict[int, dict[int, float | None]]:
    """{seed: {width: final gap}}."""
    return {seed: {w: final_gap(width_run(runs, arm, seed, w, width64), width_run(runs, "none", seed, w, width64))
                   for w in WIDTHS} for seed in SEEDS}


def width_slopes(gaps: dict) -> dict[int, float | None]:
    """{seed: slope of the final gap in ln(width)}; None where a width's pair is missing."""
    return {seed: (None if any(g is None for g in by_w.values())
                   else slope([math.log(w) for w in WIDTHS], [by_w[w] for w in WIDTHS]))
            for seed, by_w in gaps.items()}


def verdict(mean: float, holm_p: float) -> str:
    if holm_p <= ALPHA:
        return "toward the paper" if mean < 0 else "away from the paper"
    return "no direction shown"


def slope_row(by_seed: dict[int, float | None]) -> dict:
    """Per-seed slopes summarised: n kept, lost, mean and paired-t 95% interval, exact sign-flip p."""
    from andrea_jax.repro import stats
    kept = [s for s in by_seed.values() if s is not None]
    return {"n": len(kept), "lost": len(by_seed) - len(kept), **stats.paired_t(kept),
            "p": stats.sign_flip_p(kept)["p"] if kept else math.nan}


def family(slopes: dict[str, dict[int, float | None]]) -> list[dict]:
    """The four slopes' rows: n, lost, mean, paired-t interval, sign-flip p, Holm p over the family, verdict."""
    from andrea_jax.repro import stats
    rows = [{"slope": name, **slope_row(by_seed)} for name, by_seed in slopes.items()]
    for row, adjusted in zip(rows, stats.holm([r["p"] for r in rows])):
        row["holm_p"] = adjusted
        row["verdict"] = verdict(row["mean"], adjusted)
    return rows


def crossing_width(gap64: list[float], slopes: list[float], *, n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """w* = 64 exp(-mean gap at 64 / mean slope), and its 95% percentile interval over `n_boot`
    resamples of the seeds (gap64[i] and slopes[i] are seed i's). A resample whose mean slope is not
    negative never crosses: its w* is infinite, so an upper bound may be too."""
    gap64, slopes = np.asarray(gap64, float), np.asarray(slopes, float)

    def w_star(g, s):
        return WIDTHS[0] * math.exp(-g / s) if s < 0 else math.inf

    idx = np.random.default_rng(seed).integers(0, len(gap64), size=(n_boot, len(gap64)))
    boot = np.array([w_star(g, s) for g, s in zip(gap64[idx].mean(axis=1), slopes[idx].mean(axis=1))])
    # Percentiles taken as resampled values (no interpolation, which an infinite w* would make NaN).
    lo, hi = np.percentile(boot, [2.5, 97.5], method="inverted_cdf")
    return {"w": w_star(gap64.mean(), slopes.mean()), "lo": float(lo), "hi": float(hi),
            "never": float(np.mean(np.isinf(boot)))}


def analyse(runs: pathlib.Path = RUNS, width64: str = "horizon") -> dict:
    slopes, gaps_by_arm = {}, {}
    for arm in ARMS:
        slopes[f"{arm}, ln(t - {RAMP_END})"] = horizon_slopes(runs, arm)
    for arm in ARMS:
        gaps_by_arm[arm] = width_gaps(runs, arm, width64)
        slopes[f"{arm}, ln(width)"] = width_slopes(gaps_by_arm[arm])
    rows = family(slopes)
    crossings = {}
    for arm in ARMS:
        row = next(r for r in rows if r["slope"] == f"{arm}, ln(width)")
        by_seed = slopes[f"{arm}, ln(width)"]
        kept = [s for s in SEEDS if by_seed[s] is not None]
        gap64 = [gaps_by_arm[arm][s][WIDTHS[0]] for s in kept]
        if row["verdict"] == "toward the paper" and kept and np.mean(gap64) > 0:
            crossings[arm] = crossing_width(gap64, [by_seed[s] for s in kept])
    return {"rows": rows, "crossings": crossings, "ends": horizon_ends(runs), "time": machine_time(runs)}


def machine_time(runs: pathlib.Path) -> dict[str, tuple[int, float, float]]:
    """{part: (runs ended, their training seconds summed, the seconds a run of the part was training)}."""
    out = {}
    for label, parts in PARTS.items():
        folder = runs.joinpath(*parts)
        ended = [json.loads(p.read_text()) for p in folder.glob("*/result.json")]
        ended = [r for r in ended if "ended" in r]
        out[label] = (len(ended), float(sum(r["seconds"] for r in ended)), busy_seconds(folder))
    return out


def _mean_kept(values) -> float:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else math.nan


def horizon_ends(runs: pathlib.Path) -> dict:
    """Each arm's gap at 2000 in the 2000-step runs beside its gap at 8000 in the 8000-step runs (seed means)."""
    return {arm: tuple(_mean_kept(final_gap(horizon_run(runs, arm, s, steps), horizon_run(runs, "none", s, steps))
                                  for s in SEEDS) for steps in (2000, 8000)) for arm in ARMS}


def markdown(result: dict) -> str:
    lines = ["| slope of the gap (arm − none) | n (lost) | mean [paired t 95%] | sign-flip p | Holm p | verdict |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['slope']} | {r['n']} ({r['lost']}) | {r['mean']:+.4f} [{r['t_lo']:+.4f}, "
                     f"{r['t_hi']:+.4f}] | {r['p']:.3g} | {r['holm_p']:.3g} | {r['verdict']} |")
    lines += ["", "| arm | mean gap at 2000 (2000-step runs) | mean gap at 8000 (8000-step runs) |", "|---|---|---|"]
    lines += [f"| {arm} | {a:+.4f} | {b:+.4f} |" for arm, (a, b) in result["ends"].items()]
    lines.append("")
    if not result["crossings"]:
        lines.append("Crossing width: no width slope is toward the paper with a positive gap at 64; none computed.")
    for arm, c in result["crossings"].items():
        lines.append(f"Crossing width of {arm} (an extrapolation; 192 is still 2.7x short of the paper's 512): "
                     f"{c['w']:.0f} [{c['lo']:.0f}, {c['hi']:.0f}], {c['never']:.1%} of resamples never cross.")
    lines += ["", "| part | runs ended | training, summed over runs | time with a run training |", "|---|---|---|---|"]
    lines += [f"| {label} | {n} | {summed / 3600:.1f} h | {busy / 3600:.1f} h |"
              for label, (n, summed, busy) in result["time"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width64", choices=("horizon", "corpus2"), default="horizon",
                        help="where width 64's runs come from: (i)'s (pre-registered) or their corpus-2 rerun")
    sys.stdout.write(markdown(analyse(width64=parser.parse_args().width64)))
