"""Experiment M (ii), an exploratory check outside M.md (docs/preregistered/M_exploratory.md): width 64's
2000-step runs of mh_horizon.py trained again, the same arms, LRs and seeds 200-207, on the corpus
that widths 128 and 192 train on. The pre-registered width slopes take width 64 from (i)'s runs;
`_m_analysis.py --width64 corpus2` reads them with these instead, every width on one corpus:

    python -m andrea_jax.repro.sweep scripts/sweeps/mw_w64_corpus2.py --jobs 2 --runs runs/sweeps/mw_w64_corpus2
    python scripts/sweeps/_m_analysis.py --width64 corpus2
"""
from andrea_jax.repro.sweep import Sweep
from _m_choice import SEEDS, arms
from l_stage1 import L_COMMON

SWEEP = Sweep(
    name="mw_w64_corpus2",
    config="tiny",
    axes={},
    arms={arm: (*settings, f"optim.lr={lr}") for arm, (settings, lr) in arms().items()},
    baseline="none",
    seeds=SEEDS,
    common=L_COMMON,   # 2000 steps, as (i)'s runs at width 64
)
