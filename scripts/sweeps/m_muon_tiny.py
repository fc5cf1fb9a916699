"""Muon against AdamW, stage 2 on `tiny`, each at its best LR of stage 1 (m_muon_grid_tiny.py, seed
100, final validation loss: AdamW 6.007 at 1e-3 against 6.149 at 3e-3, 6.605 at 3e-4 and 6.669 at
1e-2; Muon 5.354 at 0.01 against 5.394 at 0.005, 5.411 at 0.02 and 5.629 at 0.05), on 5 fresh
seeds, paired:

    python -m andrea_jax.repro.sweep scripts/sweeps/m_muon_tiny.py --jobs 2 --report

Muon's AdamW group (embeddings, norms, biases) stays at tiny's optim.lr = 3e-3.
"""
from _questions import MUON_SEEDS, TINY_COMMON, TINY_CONFIG, muon_against_adamw

SWEEP = muon_against_adamw("m_muon_tiny", TINY_CONFIG, TINY_COMMON, adamw_lrs=("1e-3",), muon_lrs=("0.01",),
                           baseline_lr="1e-3", seeds=MUON_SEEDS)
