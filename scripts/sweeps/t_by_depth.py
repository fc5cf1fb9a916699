"""A sweep spec with explicit arms (python -m andrea_jax.repro.sweep scripts/sweeps/t_by_depth.py --jobs 2):
linear ProRes at T = 10 and 100 beside no ProRes, arms that are not a grid, at 4 and 12 Pre-LN
blocks of the `tiny` config, 2 seeds. Each depth is a group; 12 runs."""
from andrea_jax.repro.sweep import Sweep

SWEEP = Sweep(
    name="t_by_depth",
    config="tiny",
    axes={"model.n_layer": [4, 12]},
    arms={"none": ("prores.schedule=none",),
          **{f"T{T}": ("prores.schedule=linear", f"prores.warmup={T}") for T in (10, 100)}},
    baseline="none",
    seeds=(0, 1),
    common=("model.norm=pre", "train.steps=600"),
)
