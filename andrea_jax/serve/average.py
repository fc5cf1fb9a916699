"""Checkpoint averaging: `andrea-average --workdir RUN --steps a,b,c --out DIR`.

The mean, in float32, of the parameters of a run's checkpoints at the steps named, written as a
native export (`andrea-export --format native`'s format) that generate, evaluate, lm-eval and
`andrea-export --export DIR` read like any other. Averaging the last checkpoints of a run's decay,
or of its stable phase, is the usual use (LAWA; "checkpoint souping"). The export records the
newest step, whose ProRes alphas the averaged model runs with, so every step must have the same
alphas: an average across a ProRes warmup mixes blocks trained under different residual scales and
is refused. The run's folder is only read.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

import jax
import numpy as np

from andrea_jax.errors import ConfigError, LoadError
from andrea_jax.serve import load

# float32 sums of a handful of checkpoints: a mean of k parameters differs from a float64 mean by a
# few float32 rounding errors at most
DTYPE = np.float32


def parse_steps(text: str) -> list[int]:
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--steps {text!r}: a comma-separated list of checkpoint steps, e.g. 800,900,1000") from None
    if len(steps) < 2 or len(set(steps)) != len(steps):
        raise ConfigError(f"--steps {text!r}: at least two different checkpoint steps")
    return sorted(steps)


def average(workdir, steps: list[int]) -> load.LoadedModel:
    """The run's parameters averaged over `steps`, as the newest step's LoadedModel."""
    models = [load.load_workdir(workdir, step) for step in steps]
    newest = models[-1]
    alphas = [np.asarray(m.alphas()) for m in models]
    if any(not np.array_equal(a, alphas[-1]) for a in alphas):
        differing = [m.step for m, a in zip(models, alphas) if not np.array_equal(a, alphas[-1])]
        raise ConfigError(f"steps {differing} have other ProRes alphas than step {newest.step} (prores.schedule="
                          f"{newest.cfg.prores.schedule}, warmup {newest.cfg.prores.warmup}): average checkpoints "
                          f"after every block's alpha reached its final value")
    mean = jax.tree.map(lambda *leaves: sum(np.asarray(x, DTYPE) for x in leaves) / DTYPE(len(leaves)),
                        *[m.params for m in models])
    return dataclasses.replace(newest, params=mean, source=f"{workdir} steps {','.join(map(str, steps))}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="andrea-average", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="the training run whose checkpoints to average")
    parser.add_argument("--steps", required=True, help="comma-separated checkpoint steps, e.g. 800,900,1000")
    parser.add_argument("--out", required=True, help="the folder to write the averaged native export into")
    args = parser.parse_args(argv)
    try:
        averaged = average(args.workdir, parse_steps(args.steps))
        out = load.save_native(averaged, args.out)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except LoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote the average of {averaged.source} (runs with step {averaged.step}'s alphas) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
