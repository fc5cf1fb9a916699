"""Muon against AdamW, stage 2 on Experiment E's recipe (Post-LN, depth 24, width 64, prores none),
each at its best LR of stage 1 (m_muon_grid_postln.py, seed 100, final validation loss: AdamW 6.437
at 5e-4 against 6.716 at 1e-3, 6.736 at 2.5e-4 and 7.309 at 2e-3; Muon 6.111 at 0.002 against 6.161
at 0.005 and 7.31 at 0.01, 0.02, 0.05), on 5 fresh seeds, paired:

    python -m andrea_jax.repro.sweep scripts/sweeps/m_muon_postln.py --jobs 2 --report

Muon's AdamW group (embeddings, norms, biases) stays at the recipe's optim.lr = 1e-3.
"""
from _questions import MUON_SEEDS, POST_LN_COMMON, POST_LN_CONFIG, muon_against_adamw

SWEEP = muon_against_adamw("m_muon_postln", POST_LN_CONFIG, POST_LN_COMMON, adamw_lrs=("5e-4",),
                           muon_lrs=("0.002",), baseline_lr="5e-4", seeds=MUON_SEEDS, arm=("prores.schedule=none",))
