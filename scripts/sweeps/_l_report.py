"""Experiment L's tables (docs/preregistered/L.md, "Report") from its kept reports: each arm's stage-1
LR grid with the chosen LR, the three primary contrasts as pre-registered (margin 0.02, Holm over
three), every arm's stage-2 mean, the secondary contrasts (uncorrected), the primary pairs whose two
runs ran on different machines, and the machine time.

    python scripts/sweeps/_l_report.py     # markdown on standard output
"""
from __future__ import annotations

import datetime
import json
import math
import pathlib
import sys

import numpy as np

from _l_choice import EXT_EXPERIMENT, EXT_SUMMARY, LADDER, STAGE1_EXPERIMENT, STAGE1_SUMMARY, choose, primary
from _l48_choice import L_STAGE2_SUMMARY
from _questions import ROOT
from l_stage1 import ARMS, STAGE1_SEEDS, TUNED_AT_BASE_DEPTH

SECONDARY_AGAINST = ("none", "linear", "ramp_linear")
STAGE2_EXPERIMENT = "l_stage2"
RUNS = ROOT / "runs" / "sweeps"
# Stage 2 moved machines between sittings (docs/l/LOG.md, sitting 12): a run whose last start came
# before this moment ran on an Intel Xeon with AVX-512, from it on an AMD EPYC with AVX2 only.
MACHINE_SWITCH = datetime.datetime(2026, 12, 6, 8, 53, tzinfo=datetime.timezone.utc).timestamp()


def _experiment(path: pathlib.Path, name: str) -> dict:
    return json.loads(path.read_text())["experiments"][name] if path.is_file() else {"runs": {}}


def grid_table(best: dict, best_warmup: str, stage1: dict, ext: dict) -> str:
    """Mean final validation loss over stage 1's seeds of each arm at each LR it ran; the chosen LR in bold."""
    runs = {**stage1["runs"], **ext["runs"]}
    lrs = [lr for lr in LADDER if any(f"_lr{lr}_s" in name for name in runs)]
    lines = ["| arm | " + " | ".join(lrs) + " |", "|---|" + "---|" * len(lrs)]
    for arm in best:
        cells = []
        for lr in lrs:
            seeds = [runs.get(f"{arm}_lr{lr}_s{s}") for s in STAGE1_SEEDS]
            if any(r is None for r in seeds):
                cells.append("")
                continue
            ok = all(r["outcome"] == "finished" and math.isfinite(r["final_val_loss"]) for r in seeds)
            cell = f"{np.mean([r['final_val_loss'] for r in seeds]):.3f}" if ok else "diverged"
            cells.append(f"**{cell}**" if lr == best[arm] else cell)
        label = arm + (" (at 6 blocks)" if arm in TUNED_AT_BASE_DEPTH else "") + (
            " (the best warmup)" if arm == best_warmup else "")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def arm_table(names: list[str], stage2: dict) -> str:
    """Each stage-2 arm's final validation loss over its seeds: finished runs, mean and sd."""
    lines = ["| arm | finished / seeds | mean final val loss | sd |", "|---|---|---|---|"]
    for name in names:
        runs = [stage2["runs"][f"{name}_s{s}"] for s in stage2["seeds"]]
        # a run that did not finish has no final loss (None, or NaN in a report's summary)
        losses = [r["final_val_loss"] for r in runs if r.get("final_val_loss") is not None
                  and math.isfinite(r["final_val_loss"])]
        lines.append(f"| {name} | {len(losses)} / {len(runs)} | {np.mean(losses):.4f} | {np.std(losses, ddof=1):.4f} |")
    return "\n".join(lines)


def secondary_table(names: dict, stage2_path: pathlib.Path) -> str:
    """Every arm against none, linear and ramp_linear: n, mean A - B with its paired-t 95% interval,
    the exact sign-flip p; not corrected for their number."""
    from andrea_jax.repro import compare, decide, stats
    lines = ["| A − B | n | mean [paired t 95%] | sign-flip p |", "|---|---|---|---|"]
    for against in SECONDARY_AGAINST:
        b = compare.load_arm(f"{stage2_path}:{names[against]}")
        for arm, name in names.items():
            if arm in SECONDARY_AGAINST[:SECONDARY_AGAINST.index(against) + 1]:   # itself, or a row already shown
                continue
            d = list(decide.paired(compare.load_arm(f"{stage2_path}:{name}"), b).values())
            t, p = stats.paired_t(d), stats.sign_flip_p(d)["p"]
            lines.append(f"| {name} − {names[against]} | {t['n']} | {t['mean']:+.3f} [{t['t_lo']:+.3f}, "
                         f"{t['t_hi']:+.3f}] | {p:.3g} |")
    return "\n".join(lines)


def busy_seconds(runs_dir: pathlib.Path) -> float:
    """The time at least one run of runs_dir was training: the union of its runs' [started, ended]
    (result.json). A sweep paused, resumed and shared with other work over days has no single wall time."""
    spans = sorted((r["started"], r["ended"]) for r in (json.loads(p.read_text()) for p in
                                                         runs_dir.glob("*/result.json")) if "ended" in r)
    total, end = 0.0, -math.inf
    for start, stop in spans:
        total += max(0.0, stop - max(start, end))
        end = max(end, stop)
    return total


def machine_time(parts: dict) -> str:
    """Each part (label -> its report's experiment and its runs' folder): its runs, their summed
    training time and the time a run of it was training."""
    lines = ["| part | runs | training, summed over runs | time with a run training |", "|---|---|---|---|"]
    for label, (exp, runs_dir) in parts.items():
        busy = f"{busy_seconds(runs_dir) / 3600:.1f} h" if runs_dir.is_dir() else "runs not here"
        lines.append(f"| {label} | {len(exp['runs'])} | {exp.get('train_seconds', math.nan) / 3600:.1f} h | {busy} |")
    return "\n".join(lines)


def straddling(contrasts: tuple, seeds, runs_dir: pathlib.Path, switch: float = MACHINE_SWITCH) -> str:
    """For each contrast (name, arm A, arm B), the seeds whose two runs started on either side of
    `switch` (result.json's `started`): pairs that share weights and data order but not the rounding."""
    def before(name, seed):
        return json.loads((runs_dir / f"{name}_s{seed}" / "result.json").read_text())["started"] < switch
    lines = []
    for c, a, b in contrasts:
        mixed = [s for s in seeds if before(a, s) != before(b, s)]
        lines.append(f"- ({c}) {a} − {b}: {len(mixed)} of {len(seeds)} pairs on two machines"
                     + (f" (seeds {', '.join(map(str, mixed))})" if mixed else ""))
    return "\n".join(lines)


def markdown(stage1_path: pathlib.Path | None = None, ext_path: pathlib.Path | None = None,
             stage2_path: pathlib.Path | None = None, runs_root: pathlib.Path = RUNS) -> str:
    """L's tables; runs_root holds the three sweeps' run folders (l_stage1, l_stage1_ext, l_stage2)."""
    from andrea_jax.repro import compare, decide
    stage1_path, ext_path = stage1_path or STAGE1_SUMMARY, ext_path or EXT_SUMMARY
    stage2_path = stage2_path or L_STAGE2_SUMMARY
    best, best_warmup, _ = choose(stage1_path, ext_path)
    stage1, ext = _experiment(stage1_path, STAGE1_EXPERIMENT), _experiment(ext_path, EXT_EXPERIMENT)
    stage2 = _experiment(stage2_path, STAGE2_EXPERIMENT)
    names = {arm: f"{arm}_lr{best[arm]}" for arm in (*ARMS, best_warmup) if f"{arm}_lr{best[arm]}" in stage2["arms"]}
    rows = decide.decide([(c, compare.load_arm(f"{stage2_path}:{a}"), compare.load_arm(f"{stage2_path}:{b}"))
                          for c, a, b in primary(best, best_warmup)], 0.02)
    return "\n\n".join([
        "## Stage 1: each arm's LR\n\nMean final validation loss over seeds "
        f"{' and '.join(map(str, STAGE1_SEEDS))} at each LR an arm ran; the LR the pre-registered rule chose in bold.",
        grid_table(best, best_warmup, stage1, ext),
        "## Primary contrasts (pre-registered; margin 0.02 nats, Holm over the three)",
        decide.table(rows, 0.02),
        "## Stage 2: every arm at its LR",
        arm_table(list(names.values()), stage2),
        "## Secondary contrasts (reported, not corrected for their number)",
        secondary_table(names, stage2_path),
        "## Pairs that ran on two machines",
        straddling(primary(best, best_warmup), stage2["seeds"], runs_root / "l_stage2" / STAGE2_EXPERIMENT),
        "## Machine time",
        machine_time({"stage 1": (stage1, runs_root / "l_stage1" / STAGE1_EXPERIMENT),
                      "stage 1's extensions": (ext, runs_root / "l_stage1_ext" / EXT_EXPERIMENT),
                      "stage 2": (stage2, runs_root / "l_stage2" / STAGE2_EXPERIMENT)}),
    ]) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
