"""Experiment L's stage-1 choices, computed from the kept reports by the pre-registered rules
(docs/preregistered/L.md, "Stage 1"), never picked by hand: each arm's LR, whether a grid must be
extended first (its best at an edge), and the best warmup.

The reports: `docs/l/stage1` (l_stage1.py) and, once extensions ran, `docs/l/stage1_ext`
(l_stage1_ext.py), each written by `python -m andrea_jax.repro.sweep SPEC --report --out DIR`.
"""
from __future__ import annotations

import json
import pathlib

from _questions import ROOT, best_lrs
from l_stage1 import ARMS, LRS, STAGE1_SEEDS

# The LR ladder of the extension rule: 2.5e-4 below 5e-4; 4e-3, then 6e-3, above 3e-3.
LADDER = ("2.5e-4", "5e-4", "1e-3", "2e-3", "3e-3", "4e-3", "6e-3")
WARMUPS = ("none", "warmup250", "warmup500")   # the W in {60, 250, 500}
LONGER_WARMUP = "warmup1000"                   # added if warmup500 is the best warmup
EXTRA_ARMS = {LONGER_WARMUP: ("prores.schedule=none", "optim.warmup_steps=1000")}
STAGE1_SUMMARY = ROOT / "docs" / "l" / "stage1" / "prores_repro" / "summary.json"
EXT_SUMMARY = ROOT / "docs" / "l" / "stage1_ext" / "prores_repro" / "summary.json"
STAGE1_EXPERIMENT, EXT_EXPERIMENT = "l_stage1", "l_stage1_ext"


def _ext_lrs(ext_summary: pathlib.Path | None = None) -> dict[str, set]:
    """{arm: LRs} that the extension report holds a run of."""
    ext_summary = ext_summary or EXT_SUMMARY
    if not ext_summary.is_file():
        return {}
    runs = json.loads(ext_summary.read_text())["experiments"][EXT_EXPERIMENT]["runs"]
    lrs: dict[str, set] = {}
    for name in runs:
        arm, _, rest = name.rpartition("_lr")
        lrs.setdefault(arm, set()).add(rest.rpartition("_s")[0])
    return lrs


def mean_loss(reports: dict, arm: str, lr: str) -> float:
    """The mean final validation loss of ARM_lrLR over the stage-1 seeds (inf if one diverged)."""
    runs = {}
    for path, experiment in reports.items():
        runs.update(json.loads(pathlib.Path(path).read_text())["experiments"][experiment]["runs"])
    losses = [runs[f"{arm}_lr{lr}_s{s}"] for s in STAGE1_SEEDS]
    return sum(r["final_val_loss"] if r["outcome"] == "finished" else float("inf") for r in losses) / len(losses)


def choose(stage1_summary: pathlib.Path | None = None, ext_summary: pathlib.Path | None = None):
    """(best {arm: LR}, the best warmup arm, the extensions still needed {arm: (LR, ...)}), from the
    kept reports (STAGE1_SUMMARY and EXT_SUMMARY unless given)."""
    stage1_summary, ext_summary = stage1_summary or STAGE1_SUMMARY, ext_summary or EXT_SUMMARY
    reports = {stage1_summary: STAGE1_EXPERIMENT}
    if ext_summary.is_file():
        reports[ext_summary] = EXT_EXPERIMENT
    extended = _ext_lrs(ext_summary)
    grid = {arm: sorted(set(LRS) | extended.get(arm, set()), key=LADDER.index) for arm in ARMS}
    if LONGER_WARMUP in extended:
        grid[LONGER_WARMUP] = sorted(extended[LONGER_WARMUP], key=LADDER.index)
    best = best_lrs(reports, grid, STAGE1_SEEDS)   # grids low first: a tie goes to the lower LR
    needed = {}
    for arm, lr in best.items():
        i, lrs = LADDER.index(lr), grid[arm]
        if lr == lrs[0] and i > 0:
            needed[arm] = (LADDER[i - 1],)
        elif lr == lrs[-1] and i < len(LADDER) - 1:
            needed[arm] = (LADDER[i + 1],)
    warmups = [w for w in (*WARMUPS, LONGER_WARMUP) if w in best]
    best_warmup = min(warmups, key=lambda w: mean_loss(reports, w, best[w]))   # ties: the shorter W
    if best_warmup == "warmup500" and LONGER_WARMUP not in grid:
        needed[LONGER_WARMUP] = tuple(grid["warmup500"])
    return best, best_warmup, needed


def primary(best: dict, best_warmup: str) -> tuple:
    """The three pre-registered primary contrasts (name, arm A, arm B), A - B, as stage-2 arm names."""
    name = lambda arm: f"{arm}_lr{best[arm]}"
    return (("a", name("linear"), name("none")), ("b", name("ramp_linear"), name("ramp_equal")),
            ("c", name("ramp_linear"), name(best_warmup)))
