"""Experiment M's exploratory horizon control (scripts/sweeps/mh_control.py; written down before its
runs in docs/preregistered/M_exploratory.md): the slope in ln(t - 480) of each ProRes arm's gap, over
(i)'s evaluations from t = 1000 to 8000, against each baseline that does not stall, beside the
pre-registered slope against `none` at its L LR. Also each baseline's spread across seeds at
t = 2000. Exploratory: no Holm, no verdict; the mean, the paired-t 95% interval and the exact
sign-flip p of each.

    python scripts/sweeps/_m_control.py      # markdown on standard output
"""
from __future__ import annotations

import math
import pathlib
import sys

import numpy as np

import _m_analysis as m
from _m_choice import SEEDS

CONTROLS = ("none_lr1e-3", "warmup1000")
PREREGISTERED = "none (L LR)"


def control_run(runs: pathlib.Path, control: str, seed: int) -> pathlib.Path:
    return runs / "mh_control" / "mh_control" / f"{control}_s{seed}"


def baseline_run(runs: pathlib.Path, baseline: str, seed: int) -> pathlib.Path:
    if baseline == PREREGISTERED:
        return m.horizon_run(runs, "none", seed, 8000)
    return control_run(runs, baseline, seed)


def slopes(runs: pathlib.Path, arm: str, baseline: str) -> dict[int, float | None]:
    """{seed: slope of (arm - baseline) in ln(t - 480) over t = 1000, ..., 8000}; None for a lost seed."""
    return {seed: m.horizon_slope(m.horizon_run(runs, arm, seed, 8000), baseline_run(runs, baseline, seed))
            for seed in SEEDS}


def spread_at(runs: pathlib.Path, baseline: str, step: int = 2000) -> tuple[float, float, int]:
    """(mean, sd across seeds, n) of the baseline's validation loss at `step` of its 8000-step runs."""
    values = [v[step] for s in SEEDS if (v := m.val_losses(baseline_run(runs, baseline, s))) and step in v]
    return (float(np.mean(values)), float(np.std(values, ddof=1)), len(values)) if len(values) > 1 else \
        (math.nan, math.nan, len(values))


def analyse(runs: pathlib.Path = m.RUNS) -> dict:
    rows = [{"arm": arm, "baseline": baseline, **m.slope_row(slopes(runs, arm, baseline))}
            for arm in m.ARMS for baseline in (PREREGISTERED, *CONTROLS)]
    return {"rows": rows, "spread": {b: spread_at(runs, b) for b in (PREREGISTERED, *CONTROLS)}}


def markdown(result: dict) -> str:
    lines = ["| arm − baseline, slope in ln(t - 480) | n (lost) | mean [paired t 95%] | sign-flip p |",
             "|---|---|---|---|"]
    lines += [f"| {r['arm']} − {r['baseline']} | {r['n']} ({r['lost']}) | {r['mean']:+.4f} [{r['t_lo']:+.4f}, "
              f"{r['t_hi']:+.4f}] | {r['p']:.3g} |" for r in result["rows"]]
    lines += ["", "| baseline | val loss at 2000 (8000-step runs), mean ± sd | n |", "|---|---|---|"]
    lines += [f"| {b} | {mean:.3f} ± {sd:.3f} | {n} |" for b, (mean, sd, n) in result["spread"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown(analyse()))
