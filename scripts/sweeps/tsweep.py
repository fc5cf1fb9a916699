"""Experiment C: the T sweep on tiny, as a sweep spec: its arms, seeds and report text are
andrea_jax/repro/experiments.py's, so

    python -m andrea_jax.repro.sweep scripts/sweeps/tsweep.py --jobs 2

trains the same runs (runs/prores_repro/EXPERIMENT/ARM_sSEED), with the same commands, and writes the
same report (docs/RESULTS.md) as
`python scripts/reproduce_prores.py --experiment tsweep`; either one finds the other's runs done."""
from andrea_jax.repro.experiments import T_SWEEP as SWEEP  # noqa: F401
