"""Muon against AdamW, stage 1: each optimizer's learning rate from a 3-point grid, on seed 100
(not one of stage 2's), for `tiny` and for Experiment E's recipe (prores none), on the
documentation corpus:

    python -m andrea_jax.repro.sweep scripts/sweeps/m_muon_grid_tiny.py --jobs 2 --report

Stage 2 (m_muon.py) compares each optimizer at the LR with the lowest final validation loss here,
on 5 fresh seeds, paired; only that comparison may be called a gain.
"""
from andrea_jax.repro.sweep import Sweep
from _questions import MUON_GRID_SEEDS, TINY_COMMON, TINY_CONFIG

ADAMW_LRS = ("1e-3", "3e-3", "1e-2")
MUON_LRS = ("0.01", "0.02", "0.05")

SWEEP = Sweep(
    name="m_muon_grid_tiny",
    config=TINY_CONFIG,
    axes={},
    arms={**{f"adamw_lr{lr}": (f"optim.lr={lr}",) for lr in ADAMW_LRS},
          **{f"muon_lr{lr}": ("optim.name=muon", f"optim.muon_lr={lr}") for lr in MUON_LRS}},
    baseline="adamw_lr3e-3",
    seeds=MUON_GRID_SEEDS,
    common=TINY_COMMON,
)
