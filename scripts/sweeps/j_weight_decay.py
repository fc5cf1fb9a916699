"""Experiment J (b): is AdamW's equilibrium the paper's unstated condition? Experiment A's none and
linear (Post-LN, depth 24) at weight decay 1.0 and 3.0, 3 seeds, each paired with none at its
own decay, and at the default 0.1, the control on this corpus (A's own runs read the embedded one):

    python -m andrea_jax.repro.sweep scripts/sweeps/j_weight_decay.py --jobs 2 --report
"""
from andrea_jax.repro.sweep import Sweep
from _questions import POST_LN_COMMON, POST_LN_CONFIG

SWEEP = Sweep(
    name="j_weight_decay",
    config=POST_LN_CONFIG,
    axes={"optim.weight_decay": [0.1, 1.0, 3.0], "prores.schedule": ["none", "linear"]},
    baseline={"prores.schedule": "none"},
    seeds=(0, 1, 2),
    common=POST_LN_COMMON,
)
