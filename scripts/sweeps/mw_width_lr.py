"""Experiment M (ii), the width grids (docs/preregistered/M.md): none, linear and L's best ramp at
widths 128 and 192 (heads of 16), each on the LR grid {5e-4, 1e-3, 2e-3, 3e-3} and the extensions
its report asks for (L's ladder), on seeds 300-301. Repeat both commands until `_m_choice.width_lrs`
needs nothing more (mw_width.py then loads):

    python -m andrea_jax.repro.sweep scripts/sweeps/mw_width_lr.py --jobs 2 --runs runs/sweeps/mw_width_lr
    python -m andrea_jax.repro.sweep scripts/sweeps/mw_width_lr.py --report --out docs/m/width_lr
"""
from andrea_jax.repro.sweep import Sweep
from _m_choice import GRID_SEEDS, GRID_WIDTHS, arms, width, width_lrs
from l_stage1 import L_COMMON

SETTINGS = arms()
_, _, LRS = width_lrs()

SWEEP = Sweep(
    name="mw_width_lr",
    config="tiny",
    axes={},
    arms={f"{arm}_w{w}_lr{lr}": (*SETTINGS[arm][0], *width(w), f"optim.lr={lr}")
          for arm in SETTINGS for w in GRID_WIDTHS for lr in LRS[f"{arm}_w{w}"]},
    baseline=f"none_w{GRID_WIDTHS[0]}_lr1e-3",   # the grids choose LRs; their pairing is not read
    seeds=GRID_SEEDS,
    common=L_COMMON,
)
