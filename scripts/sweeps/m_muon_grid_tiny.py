"""Muon against AdamW, stage 1: each optimizer's learning rate from a grid of 3 points, on seed 100
(not one of stage 2's), for `tiny` and for Experiment E's recipe (m_muon_grid_postln.py), on the
documentation corpus. Each grid has points below its first three (AdamW's 1e-3 / 5e-4, Muon's
0.01), added because those put the best at their lowest LR; on the Post-LN recipe every Muon run of
the first three stayed on the unigram plateau, so its grid goes down to 0.002:

    python -m andrea_jax.repro.sweep scripts/sweeps/m_muon_grid_tiny.py --jobs 2 --report

Stage 2 (m_muon_tiny.py, m_muon_postln.py) compares each optimizer at the LR with the lowest final
validation loss here, on 5 fresh seeds, paired; only that comparison may be called a gain.
"""
from _questions import TINY_COMMON, TINY_CONFIG, muon_against_adamw

SWEEP = muon_against_adamw("m_muon_grid_tiny", TINY_CONFIG, TINY_COMMON,
                           adamw_lrs=("3e-4", "1e-3", "3e-3", "1e-2"),
                           muon_lrs=("0.005", "0.01", "0.02", "0.05"), baseline_lr="3e-3")
