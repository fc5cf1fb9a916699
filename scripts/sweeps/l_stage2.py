"""Experiment L, stage 2 (docs/preregistered/L.md): every arm at its stage-1 LR, the best warmup at
its (W, LR), on 16 fresh seeds; Depth-muP at 24 blocks at the LR of its 6-block grid. The LRs and
the best warmup are computed from the kept stage-1 reports by the pre-registered rules
(`_l_choice.choose`); loading this spec refuses while a grid still needs an extension.

    python -m andrea_jax.repro.sweep scripts/sweeps/l_stage2.py --jobs 2 --runs runs/sweeps/l_stage2
    python -m andrea_jax.repro.sweep scripts/sweeps/l_stage2.py --report --out docs/l/stage2
    python scripts/sweeps/l_stage2.py        # prints the decide command of the three primary contrasts
"""
import sys

from andrea_jax.errors import ConfigError
from andrea_jax.repro.sweep import Sweep
from _l_choice import EXTRA_ARMS, choose, primary
from l_stage1 import ARMS, L_COMMON

BEST, BEST_WARMUP, NEEDED = choose()
if NEEDED:
    raise ConfigError(f"Experiment L's stage-1 grids still need extensions {NEEDED}: run "
                      f"scripts/sweeps/l_stage1_ext.py and its --report first")
STAGE2_ARMS = ("none", "linear", "linear_alpha", "ramp_linear", "ramp_equal", "ramp_reverse", "depth_mup",
               "zero_init_out", "gates", *((BEST_WARMUP,) if BEST_WARMUP != "none" else ()))
SEEDS = tuple(range(16))
ARM_SETTINGS = {**ARMS, **EXTRA_ARMS}
NAME = {arm: f"{arm}_lr{BEST[arm]}" for arm in STAGE2_ARMS}

SWEEP = Sweep(
    name="l_stage2",
    config="tiny",
    axes={},
    arms={NAME[arm]: (*ARM_SETTINGS[arm], f"optim.lr={BEST[arm]}") for arm in STAGE2_ARMS},
    baseline=NAME["none"],
    seeds=SEEDS,
    common=L_COMMON,
)


def decide_command(summary: str = "/".join(("docs", "l", "stage2", "prores_repro", "summary.json"))) -> str:
    """The pre-registered contrasts (a), (b), (c) at the margin 0.02, Holm over the three, on stage 2's
    report (written by the --report command above)."""
    return "python -m andrea_jax.repro.decide --margin 0.02 " + " ".join(
        f"--contrast {c} {summary}:{a} {summary}:{b}" for c, a, b in primary(BEST, BEST_WARMUP))


if __name__ == "__main__":
    print(decide_command())
    sys.exit(0)
