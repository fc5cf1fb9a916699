"""Experiment J (a), one of the mechanism's predictions, 4 seeds:

    python -m andrea_jax.repro.sweep scripts/sweeps/j_sandwich.py --jobs 2 --report

- (a) Sandwich-LN against Pre-LN under unscaled linear ProRes (Experiment H's recipe): the sandwich
  norm bounds what Adam can inflate, so ProRes's cost should be under a third of Pre-LN's. Groups
  by model.norm, each arm paired with none of its own placement.
- (b) is j_weight_decay.py: Experiment A's none and linear at weight decay 1.0 and 3.0.
"""
from andrea_jax.repro.sweep import Sweep
from _questions import H_COMMON, H_CONFIG

SWEEP = Sweep(
    name="j_sandwich",
    config=H_CONFIG,
    axes={"model.norm": ["pre", "sandwich"], "prores.schedule": ["none", "linear"]},
    baseline={"prores.schedule": "none"},
    seeds=(0, 1, 2, 3),
    common=tuple(s for s in H_COMMON if not s.startswith("model.norm=")),
)
