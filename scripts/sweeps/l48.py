"""Experiment L's follow-up at 48 blocks, part 2 (docs/preregistered/L.md, "Conditional follow-up at
48 blocks"): `ramp_linear`, `ramp_equal` (T = 10) and the best warmup of l48_warmup.py, each at its
24-block LR, on 16 seeds; contrasts (b) and (c), Holm over the two. Loading refuses unless L's
contrast (b) found `ramp_linear` better, and until l48_warmup's report chose the warmup:

    python -m andrea_jax.repro.sweep scripts/sweeps/l48.py --jobs 2 --runs runs/sweeps/l48
    python -m andrea_jax.repro.sweep scripts/sweeps/l48.py --report --out docs/l/l48
    python scripts/sweeps/l48.py        # prints the decide command of (b) and (c)
"""
import sys

from andrea_jax.repro.sweep import Sweep
from _l48_choice import L48_COMMON, SEEDS, due, stage_arms

due()
ARMS = stage_arms()
RAMP_LINEAR, RAMP_EQUAL, WARMUP = ARMS

SWEEP = Sweep(
    name="l48",
    config="tiny",
    axes={},
    arms=ARMS,
    baseline=RAMP_EQUAL,   # the report's arm - baseline is then contrast (b)
    seeds=SEEDS,
    common=L48_COMMON,
)


def decide_command(summary: str = "/".join(("docs", "l", "l48", "prores_repro", "summary.json"))) -> str:
    """Contrasts (b) and (c) at the margin 0.02, Holm over the two, on this sweep's report."""
    return (f"python -m andrea_jax.repro.decide --margin 0.02 --contrast b {summary}:{RAMP_LINEAR} "
            f"{summary}:{RAMP_EQUAL} --contrast c {summary}:{RAMP_LINEAR} {summary}:{WARMUP}")


if __name__ == "__main__":
    print(decide_command())
    sys.exit(0)
