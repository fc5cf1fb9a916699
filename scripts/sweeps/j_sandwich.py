"""Experiment J (a), one of the mechanism's predictions, 4 seeds:

    python -m andrea_jax.repro.sweep scripts/sweeps/j_sandwich.py --jobs 2 --report

- (a) Sandwich-LN against Pre-LN under unscaled linear ProRes (Experiment H's recipe): the sandwich
  norm bounds what Adam can inflate, so ProRes's cost should be under a third of Pre-LN's. This
  sweep runs the sandwich placement's none and linear. Pre-LN's are Experiment H's own `none` and
  `linear` (h_prores_or_warmup.py, the same recipe and seeds; a run is the same bit for bit in
  either sweep), paired across the two reports with `python -m andrea_jax.repro.compare`.
- (b) is j_weight_decay.py: Experiment A's none and linear at weight decay 1.0 and 3.0.
"""
from andrea_jax.repro.sweep import Sweep
from _questions import H_COMMON, H_CONFIG

SWEEP = Sweep(
    name="j_sandwich",
    config=H_CONFIG,
    axes={},
    arms={"none": ("prores.schedule=none",), "linear": ("prores.schedule=linear",)},
    baseline="none",
    seeds=(0, 1, 2, 3),
    common=("model.norm=sandwich", *(s for s in H_COMMON if not s.startswith("model.norm="))),
)
