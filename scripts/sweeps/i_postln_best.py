"""Experiment I, stage 2: each arm of stage 1 (i_postln_lr.py) at its best LR, rerun on 4 fresh
seeds and paired against `none` at its own best LR. Only this best-against-best comparison may be
called a gain (the method of Wortsman et al., arXiv 2309.14322):

    python -m andrea_jax.repro.sweep scripts/sweeps/i_postln_best.py --jobs 2 --report

An arm's best LR is the one with the lowest mean final validation loss over seeds 0-1 of stage 1
and its extension to lower LRs (i_postln_lr_low.py), read from their kept reports (docs/i/), so the
choice is computed, not picked by hand.
"""
from andrea_jax.repro.sweep import Sweep
from _questions import POST_LN_COMMON, POST_LN_CONFIG, ROOT, best_lrs
from i_postln_lr import ARMS, LRS, SWEEP as STAGE1, lr_arms
from i_postln_lr_low import LRS as LOW_LRS, SWEEP as STAGE1_LOW

STAGE1_REPORTS = {ROOT / "docs" / "i" / name / "prores_repro" / "summary.json": sweep.name
                  for name, sweep in (("postln_lr", STAGE1), ("postln_lr_low", STAGE1_LOW))}
CHOSEN_ON_SEEDS = (0, 1)
BEST = best_lrs(STAGE1_REPORTS, {arm: (*LOW_LRS[arm], *LRS[arm]) for arm in ARMS}, CHOSEN_ON_SEEDS)

SWEEP = Sweep(
    name="i_postln_best",
    config=POST_LN_CONFIG,
    axes={},
    arms=lr_arms({arm: (lr,) for arm, lr in BEST.items()}),
    baseline=f"none_lr{BEST['none']}",
    seeds=(4, 5, 6, 7),
    common=POST_LN_COMMON,
)
