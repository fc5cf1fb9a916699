"""Experiment M, an exploratory control of part (i), decided after (i) was read, written down before any of
its runs (docs/preregistered/M_exploratory.md). Is the ramp's horizon slope away from the paper because `none`
at its L LR (2e-3) starts slowly on half its seeds? Two baselines that do not stall, 8000 steps on
(i)'s seeds 200-207, paired with (i)'s 8000-step `linear` and `ramp` runs by seed: `none` at 1e-3
(where L's exploratory control found `none` as tight as `linear`), and L's best global LR warmup
at its L LR. `_m_control.py` reads them:

    python -m andrea_jax.repro.sweep scripts/sweeps/mh_control.py --jobs 2 --runs runs/sweeps/mh_control
    python scripts/sweeps/_m_control.py
"""
from andrea_jax.repro.sweep import Sweep
from _l_choice import EXTRA_ARMS, choose
from _m_choice import SEEDS
from l_stage1 import ARMS, L_COMMON

BEST, BEST_WARMUP, _ = choose()

SWEEP = Sweep(
    name="mh_control",
    config="tiny",
    axes={},
    arms={"none_lr1e-3": (*ARMS["none"], "optim.lr=1e-3"),
          BEST_WARMUP: (*{**ARMS, **EXTRA_ARMS}[BEST_WARMUP], f"optim.lr={BEST[BEST_WARMUP]}")},
    baseline="none_lr1e-3",   # its pairs are with mh_horizon's runs, by seed (_m_control.py)
    seeds=SEEDS,
    common=(*L_COMMON, "train.steps=8000"),
)
