"""Experiment I, stage 1: Post-LN's sensitivity to the learning rate (the method of Wortsman et al.,
arXiv 2309.14322), on Experiment A's recipe and the documentation corpus, 4 seeds:

    python -m andrea_jax.repro.sweep scripts/sweeps/i_postln_lr.py --jobs 2 --report

Stage 2 (i_postln_best.py) reruns each arm at its best LR, chosen on seeds 0-1 of this stage and of
its extension to lower LRs (i_postln_lr_low.py), on 4 fresh seeds; only that best-against-best
comparison may be called a gain.
"""
from andrea_jax.repro.sweep import Sweep
from _questions import POST_LN_COMMON, POST_LN_CONFIG

ARMS = {"none": ("prores.schedule=none",),
        "linear_alpha": ("prores.schedule=linear", "prores.scale_updates=alpha"),
        "forward_false_alpha": ("prores.schedule=linear", "prores.forward=false", "prores.scale_updates=alpha")}
LRS = {"none": ("5e-4", "1e-3", "2e-3"), "linear_alpha": ("1e-3", "2e-3", "3e-3"),
       "forward_false_alpha": ("2e-3", "3e-3")}


def lr_arms(lrs: dict) -> dict:
    """ARM_lrLR: ARMS[ARM] at optim.lr = LR, for each LR of lrs[ARM]."""
    return {f"{arm}_lr{lr}": (*ARMS[arm], f"optim.lr={lr}") for arm, arm_lrs in lrs.items() for lr in arm_lrs}


SWEEP = Sweep(
    name="i_postln_lr",
    config=POST_LN_CONFIG,
    axes={},
    arms=lr_arms(LRS),
    baseline="none_lr1e-3",
    seeds=(0, 1, 2, 3),
    common=POST_LN_COMMON,
)
