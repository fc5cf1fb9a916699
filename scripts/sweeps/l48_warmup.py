"""Experiment L's follow-up at 48 blocks, part 1 (docs/preregistered/L.md, "Conditional follow-up at
48 blocks"): the best warmup's W at 48 blocks, W = 490 (ProRes's mean ramp there) against W at its
stage-1 value, at the best warmup's LR, on stage 1's seeds. Loading refuses unless L's contrast (b)
found `ramp_linear` better than `ramp_equal` (`_l48_choice.due`):

    python -m andrea_jax.repro.sweep scripts/sweeps/l48_warmup.py --jobs 2 --runs runs/sweeps/l48_warmup
    python -m andrea_jax.repro.sweep scripts/sweeps/l48_warmup.py --report --out docs/l/l48_warmup
"""
from andrea_jax.repro.sweep import Sweep
from _l48_choice import L48_COMMON, due, warmup_arms
from l_stage1 import STAGE1_SEEDS

due()
ARMS = warmup_arms()

SWEEP = Sweep(
    name="l48_warmup",
    config="tiny",
    axes={},
    arms=ARMS,
    baseline=next(iter(ARMS)),   # a choice of W; its pairing is not read
    seeds=STAGE1_SEEDS,
    common=L48_COMMON,
)
