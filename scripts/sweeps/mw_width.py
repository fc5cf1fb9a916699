"""Experiment M (ii), the width runs (docs/preregistered/M.md): none, linear and L's best ramp at
widths 128 and 192, each at the LR its grid chose (`_m_choice.width_lrs`), on seeds 200-207, 2000
steps; width 64's runs are mh_horizon.py's at 2000 steps. Loading refuses while a grid needs more:

    python -m andrea_jax.repro.sweep scripts/sweeps/mw_width.py --jobs 2 --runs runs/sweeps/mw_width
    python -m andrea_jax.repro.sweep scripts/sweeps/mw_width.py --report --out docs/m/width
"""
from andrea_jax.errors import ConfigError
from andrea_jax.repro.sweep import Sweep
from _m_choice import GRID_WIDTHS, SEEDS, WIDTH_LR_SUMMARY, arms, width, width_lrs
from l_stage1 import L_COMMON

if not WIDTH_LR_SUMMARY.is_file():
    raise ConfigError(f"{WIDTH_LR_SUMMARY}: no report of mw_width_lr yet: run mw_width_lr.py and its "
                      f"--report first")
BEST, NEEDED, _ = width_lrs()
if NEEDED:
    raise ConfigError(f"the width grids still need {NEEDED}: run mw_width_lr.py and its --report again")
SETTINGS = arms()

SWEEP = Sweep(
    name="mw_width",
    config="tiny",
    axes={},
    arms={f"{arm}_w{w}": (*SETTINGS[arm][0], *width(w), f"optim.lr={BEST[f'{arm}_w{w}']}")
          for arm in SETTINGS for w in GRID_WIDTHS},
    baseline=f"none_w{GRID_WIDTHS[0]}",
    seeds=SEEDS,
    common=L_COMMON,
)
