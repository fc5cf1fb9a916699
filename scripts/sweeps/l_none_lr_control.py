"""Experiment L, exploratory control, chosen after stage 2 was read: is (a)'s inconclusive verdict the
baseline's LR? The rule gave `none` LR 2e-3, 0.008 ahead of 1e-3 in stage 1, and at 2e-3 its final
loss spreads across the stage-2 seeds (sd 0.109, against 0.039 for `linear` at 1e-3). So `none` at
1e-3, L's recipe and stage 2's seeds, paired with stage 2's arms across the reports by
`python -m andrea_jax.repro.compare --baseline` once its report is written:

    python -m andrea_jax.repro.sweep scripts/sweeps/l_none_lr_control.py --jobs 2 --runs runs/sweeps/l_none_lr_control
    python -m andrea_jax.repro.sweep scripts/sweeps/l_none_lr_control.py --report --out docs/l/none_lr_control
"""
from andrea_jax.repro.sweep import Sweep
from l_stage1 import ARMS, L_COMMON

SWEEP = Sweep(
    name="l_none_lr_control",
    config="tiny",
    axes={},
    arms={"none_lr1e-3": (*ARMS["none"], "optim.lr=1e-3")},
    baseline="none_lr1e-3",  # its own: the pairs are with stage 2's arms, across the reports
    seeds=tuple(range(16)),
    common=L_COMMON,
)
