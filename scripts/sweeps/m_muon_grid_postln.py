"""Muon against AdamW, stage 1 on Experiment E's recipe (Post-LN, depth 24, width 64, prores
none; LR 1e-3 after 150 steps): each optimizer's LR from a grid on seed 100, extended down as
m_muon_grid_tiny.py says (and what stage 2 is):

    python -m andrea_jax.repro.sweep scripts/sweeps/m_muon_grid_postln.py --jobs 2 --report
"""
from _questions import POST_LN_COMMON, POST_LN_CONFIG, muon_against_adamw

SWEEP = muon_against_adamw("m_muon_grid_postln", POST_LN_CONFIG, POST_LN_COMMON,
                           adamw_lrs=("2.5e-4", "5e-4", "1e-3", "2e-3"),
                           muon_lrs=("0.002", "0.005", "0.01", "0.02", "0.05"),
                           baseline_lr="1e-3", arm=("prores.schedule=none",))
