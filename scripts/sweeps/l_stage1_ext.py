"""Experiment L, stage 1's grid extensions (docs/preregistered/L.md, "Stage 1", Interior): the runs
that the kept reports say an arm still needs because its best LR is the lowest or highest its grid
holds (2.5e-4 below 5e-4; 4e-3, then 6e-3, above 3e-3), and W = 1000 at warmup500's LRs if
warmup500 is the best warmup. Computed by `_l_choice.choose` from docs/l/stage1 and this sweep's
own report, on stage 1's seeds. Repeat the two commands until loading this spec says nothing is
needed:

    python -m andrea_jax.repro.sweep scripts/sweeps/l_stage1_ext.py --jobs 2 --runs runs/sweeps/l_stage1_ext
    python -m andrea_jax.repro.sweep scripts/sweeps/l_stage1_ext.py --report --out docs/l/stage1_ext
"""
from andrea_jax.errors import ConfigError
from andrea_jax.repro.sweep import Sweep
from _l_choice import EXTRA_ARMS, _ext_lrs, choose
from l_stage1 import ARMS, L_COMMON, STAGE1_SEEDS, TUNED_AT_BASE_DEPTH

_, _, NEEDED = choose()
DONE = _ext_lrs()
if not NEEDED and not DONE:
    raise ConfigError("Experiment L's stage-1 grids need no extension: every best LR is interior")
LRS = {arm: tuple(sorted(set(DONE.get(arm, ())) | set(NEEDED.get(arm, ())))) for arm in {**DONE, **NEEDED}}
ARM_SETTINGS = {**ARMS, **EXTRA_ARMS}

EXT_ARMS = {f"{arm}_lr{lr}": (*ARM_SETTINGS[arm], *TUNED_AT_BASE_DEPTH.get(arm, ()), f"optim.lr={lr}")
            for arm, lrs in sorted(LRS.items()) for lr in lrs}

SWEEP = Sweep(
    name="l_stage1_ext",
    config="tiny",
    axes={},
    arms=EXT_ARMS,
    baseline=next(iter(EXT_ARMS)),   # stage 1's extensions choose LRs; their pairing is not read
    seeds=STAGE1_SEEDS,
    common=L_COMMON,
)
