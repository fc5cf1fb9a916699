"""Experiment A: Post-LN schedule ablation at depth 24, as a sweep spec: its arms, seeds and report text are
andrea_jax/repro/experiments.py's, so

    python -m andrea_jax.repro.sweep scripts/sweeps/ablation.py --jobs 2

trains the same runs (runs/prores_repro/EXPERIMENT/ARM_sSEED), with the same commands, and writes the
same report (docs/RESULTS.md) as
`python scripts/reproduce_prores.py --experiment ablation`; either one finds the other's runs done."""
from andrea_jax.repro.experiments import ABLATION as SWEEP  # noqa: F401
