"""A sweep spec (python -m andrea_jax.repro.sweep scripts/sweeps/depth_x_schedule.py --jobs 2): Pre-LN
`tiny` at 12, 24 and 48 blocks, ProRes off or linear, updates scaled or not, 3 seeds, each arm
paired with no ProRes and no scaling at its own depth. 36 runs."""
from andrea_jax.repro.sweep import Sweep

SWEEP = Sweep(
    name="depth_x_schedule",
    config="tiny",
    axes={"model.n_layer": [12, 24, 48], "prores.schedule": ["none", "linear"],
          "prores.scale_updates": ["none", "alpha"]},
    baseline={"prores.schedule": "none", "prores.scale_updates": "none"},
    seeds=(0, 1, 2),
    common=("model.norm=pre", "train.steps=300", "prores.warmup=3"),
)
