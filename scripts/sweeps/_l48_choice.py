"""Experiment L's conditional follow-up at 48 blocks (docs/preregistered/L.md), computed from kept
reports by the pre-registered rules, never picked by hand. It is due only if contrast (b) of L's
stage 2, Holm over (a), (b), (c), found `ramp_linear` better than `ramp_equal`. Then `ramp_linear`,
`ramp_equal` (T = 10) and the best warmup run at 48 blocks, each at its 24-block LR, where the best
warmup is the better (lower mean final loss on stage 1's seeds) of W = 490, ProRes's mean ramp
T (L + 1) / 2 at 48 blocks, and W at the best warmup's stage-1 value.
"""
from __future__ import annotations

import json
import pathlib

from _l_choice import EXTRA_ARMS, choose, mean_loss, primary
from _questions import ROOT
from l_stage1 import ARMS, L_COMMON, STAGE1_SEEDS, T

N_LAYER = 48
RESCALED_W = T * (N_LAYER + 1) // 2                  # 490
L48_COMMON = tuple(f"model.n_layer={N_LAYER}" if s.startswith("model.n_layer=") else s for s in L_COMMON)
SEEDS = tuple(range(16))
L_STAGE2_SUMMARY = ROOT / "docs" / "l" / "stage2" / "prores_repro" / "summary.json"
WARMUP_SUMMARY = ROOT / "docs" / "l" / "l48_warmup" / "prores_repro" / "summary.json"
WARMUP_EXPERIMENT = "l48_warmup"


def stage2_verdicts(summary: pathlib.Path | None = None) -> dict[str, str]:
    """{contrast: verdict} of L's stage 2 as docs/preregistered/L.md decides them: margin 0.02, Holm over three."""
    from andrea_jax.errors import ConfigError
    from andrea_jax.repro import compare, decide
    summary = summary or L_STAGE2_SUMMARY
    if not summary.is_file():
        raise ConfigError(f"{summary}: no report of l_stage2 to decide from; run l_stage2.py's --report first")
    best, best_warmup, _ = choose()
    arms = [(c, compare.load_arm(f"{summary}:{a}"), compare.load_arm(f"{summary}:{b}"))
            for c, a, b in primary(best, best_warmup)]
    return {row["contrast"]: row["verdict"] for row in decide.decide(arms, 0.02)}


def due(summary: pathlib.Path | None = None) -> None:
    """Raises ConfigError unless L's contrast (b) found shallow-first better."""
    from andrea_jax.errors import ConfigError
    verdict = stage2_verdicts(summary)["b"]
    if not verdict.startswith("A better"):
        raise ConfigError(f"the 48-block follow-up is not due: L's contrast (b) ramp_linear - ramp_equal is "
                          f"{verdict!r}, and only 'A better' calls for it")


def warmup_steps(settings: tuple) -> int:
    """optim.warmup_steps of a run with L's recipe and `settings` (the last one given wins)."""
    values = [s.partition("=")[2] for s in (*L_COMMON, *settings) if s.startswith("optim.warmup_steps=")]
    return int(values[-1])


def warmup_arms() -> dict[str, tuple]:
    """{warmupW_lrLR: settings} for W in (490, the best warmup's stage-1 W) at the best warmup's LR."""
    best, best_warmup, _ = choose()
    stage1_w = warmup_steps({**ARMS, **EXTRA_ARMS}[best_warmup])
    lr = best[best_warmup]
    return {f"warmup{w}_lr{lr}": ("prores.schedule=none", f"optim.warmup_steps={w}", f"optim.lr={lr}")
            for w in sorted({RESCALED_W, stage1_w})}


def best_warmup(summary: pathlib.Path | None = None) -> str:
    """The arm of warmup_arms() with the lower mean final loss on stage 1's seeds (ties: the shorter W)."""
    from andrea_jax.errors import ConfigError
    summary = summary or WARMUP_SUMMARY
    if not summary.is_file():
        raise ConfigError(f"{summary}: no report of {WARMUP_EXPERIMENT} to choose the warmup from; run "
                          f"l48_warmup.py and its --report first")
    runs = json.loads(summary.read_text())["experiments"][WARMUP_EXPERIMENT]["runs"]
    for arm in warmup_arms():
        for seed in STAGE1_SEEDS:
            outcome = runs.get(f"{arm}_s{seed}", {"outcome": "not run"})["outcome"]
            if outcome not in ("finished", "diverged"):
                raise ConfigError(f"{arm}_s{seed} is {outcome} in {summary}, so the best warmup is not known yet")
    reports = {summary: WARMUP_EXPERIMENT}
    return min(warmup_arms(), key=lambda arm: mean_loss(reports, *arm.rsplit("_lr", 1)))


def stage_arms(warmup_summary: pathlib.Path | None = None) -> dict[str, tuple]:
    """{ARM_lrLR: settings}: ramp_linear and ramp_equal at their 24-block LRs and the best warmup."""
    best, _, _ = choose()
    arms = {f"{arm}_lr{best[arm]}": (*ARMS[arm], f"optim.lr={best[arm]}") for arm in ("ramp_linear", "ramp_equal")}
    chosen = best_warmup(warmup_summary)
    return {**arms, chosen: warmup_arms()[chosen]}
