"""Experiment M (i), horizon (docs/preregistered/M.md): none, linear and L's best ramp at their L
stage-1 LRs, 2000 and 8000 steps at width 64, on seeds 200-207, validation every 500 steps (the
paired gap at every evaluation). The arms come from L's kept reports (`_m_choice`):

    python -m andrea_jax.repro.sweep scripts/sweeps/mh_horizon.py --jobs 2 --runs runs/sweeps/mh_horizon
    python -m andrea_jax.repro.sweep scripts/sweeps/mh_horizon.py --report --out docs/m/horizon
"""
from andrea_jax.repro.sweep import Sweep
from _m_choice import SEEDS, arms
from l_stage1 import L_COMMON

SWEEP = Sweep(
    name="mh_horizon",
    config="tiny",
    axes={"train.steps": [2000, 8000]},
    arms={arm: (*settings, f"optim.lr={lr}") for arm, (settings, lr) in arms().items()},
    baseline="none",
    seeds=SEEDS,
    common=L_COMMON,
)
