"""Muon against AdamW, stage 1 on Experiment E's recipe (Post-LN, depth 24, width 64, prores
none; LR 1e-3 after 150 steps): each optimizer's LR from a 3-point grid on seed 100:

    python -m andrea_jax.repro.sweep scripts/sweeps/m_muon_grid_postln.py --jobs 2 --report

The `tiny` half and stage 2: m_muon_grid_tiny.py, m_muon.py.
"""
from andrea_jax.repro.sweep import Sweep
from _questions import MUON_GRID_SEEDS, POST_LN_COMMON, POST_LN_CONFIG

ADAMW_LRS = ("5e-4", "1e-3", "2e-3")
MUON_LRS = ("0.01", "0.02", "0.05")

SWEEP = Sweep(
    name="m_muon_grid_postln",
    config=POST_LN_CONFIG,
    axes={},
    arms={**{f"adamw_lr{lr}": ("prores.schedule=none", f"optim.lr={lr}") for lr in ADAMW_LRS},
          **{f"muon_lr{lr}": ("prores.schedule=none", "optim.name=muon", f"optim.muon_lr={lr}") for lr in MUON_LRS}},
    baseline="adamw_lr1e-3",
    seeds=MUON_GRID_SEEDS,
    common=POST_LN_COMMON,
)
