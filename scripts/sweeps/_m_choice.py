"""Experiment M's arms and LRs, computed from kept reports by the pre-registered rules
(docs/preregistered/M.md), never picked by hand: `none` and `linear` at their L stage-1 LRs, `ramp`
as L's best ramp (the lowest mean final loss of the three ramps in L's stage 2), and at widths 128
and 192 each arm's LR from its own grid (mw_width_lr.py), extended like L's until interior.
"""
from __future__ import annotations

import json
import pathlib

from _l_choice import LADDER, choose as l_choose
from _questions import ROOT, best_lrs
from l_stage1 import ARMS, LRS

RAMPS = ("ramp_linear", "ramp_equal", "ramp_reverse")
SEEDS = tuple(range(200, 208))        # every run outside the width grids
GRID_SEEDS = (300, 301)
HEADS = {64: 4, 128: 8, 192: 12}      # heads of 16
GRID_WIDTHS = (128, 192)              # width 64 takes L's LRs
L_STAGE2_SUMMARY = ROOT / "docs" / "l" / "stage2" / "prores_repro" / "summary.json"
WIDTH_LR_SUMMARY = ROOT / "docs" / "m" / "width_lr" / "prores_repro" / "summary.json"


def _runs(summary: pathlib.Path, experiment: str) -> dict:
    from andrea_jax.errors import ConfigError
    try:
        return json.loads(summary.read_text())["experiments"][experiment]["runs"]
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"{summary}: no report of {experiment} to choose from ({e!r}); run that sweep "
                          f"with --report first") from None


def best_ramp(summary: pathlib.Path | None = None) -> str:
    """The ramp of L's stage 2 with the lowest mean final validation loss (a diverged run: infinite)."""
    best, _, _ = l_choose()
    runs = _runs(summary or L_STAGE2_SUMMARY, "l_stage2")

    def mean(arm):
        seeds = [r for name, r in runs.items() if name.startswith(f"{arm}_lr{best[arm]}_s")]
        return sum(r["final_val_loss"] if r["outcome"] == "finished" else float("inf") for r in seeds) / len(seeds)
    return min(RAMPS, key=mean)


def arms(summary: pathlib.Path | None = None) -> dict[str, tuple[tuple, str]]:
    """{M arm: (its settings, its L stage-1 LR)} for none, linear and ramp."""
    best, _, _ = l_choose()
    ramp = best_ramp(summary)
    return {"none": (ARMS["none"], best["none"]), "linear": (ARMS["linear"], best["linear"]),
            "ramp": (ARMS[ramp], best[ramp])}


def width(w: int) -> tuple:
    return (f"model.d_model={w}", f"model.n_head={HEADS[w]}")


def _grid_lrs(done: dict) -> dict:
    """{ARM_wW: LRs}: the stage grid and what the width grid's report holds beyond it."""
    return {f"{arm}_w{w}": sorted(set(LRS) | done.get(f"{arm}_w{w}", set()), key=LADDER.index)
            for arm in ("none", "linear", "ramp") for w in GRID_WIDTHS}


def width_lrs(summary: pathlib.Path | None = None) -> tuple[dict, dict, dict]:
    """(best {ARM_wW: LR}, needed {ARM_wW: (LR,)}, the grid to run {ARM_wW: LRs}) from the width
    grids' report, by L's rule and ladder; before that report exists, nothing is chosen and the
    grid is the stage grid."""
    summary = summary or WIDTH_LR_SUMMARY
    if not summary.is_file():
        return {}, {}, _grid_lrs({})
    done: dict = {}
    for name in _runs(summary, "mw_width_lr"):
        key, _, rest = name.rpartition("_lr")
        done.setdefault(key, set()).add(rest.rpartition("_s")[0])
    grid = _grid_lrs(done)
    best = best_lrs({summary: "mw_width_lr"}, grid, GRID_SEEDS)
    needed = {}
    for key, lr in best.items():
        i = LADDER.index(lr)
        if lr == grid[key][0] and i > 0:
            needed[key] = (LADDER[i - 1],)
        elif lr == grid[key][-1] and i < len(LADDER) - 1:
            needed[key] = (LADDER[i + 1],)
    return best, needed, {key: sorted(set(lrs) | set(needed.get(key, ())), key=LADDER.index)
                          for key, lrs in grid.items()}
