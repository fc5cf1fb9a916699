"""Experiment H, part 2 (part 1: h_prores_or_warmup.py, the same recipe and seeds): the per-block
LR ramp without ProRes's forward scaling, and the depth parameterisations, against none:

    python -m andrea_jax.repro.sweep scripts/sweeps/h_depth_params.py --jobs 2 --report

- forward_false_alpha: alpha(l, t) left out of the forward pass while each block's update is
  scaled by it: the pure per-block LR ramp;
- depth_mup, completep: branch multiplier (L / L0)^-a with a = 1/2 and 1 and their hidden-weight
  Adam rules, with L0 = 4 (the 4-block `tiny`, where LR 3e-3 was chosen).
"""
from andrea_jax.repro.sweep import Sweep
from _questions import H_COMMON, H_CONFIG, H_SEEDS

SWEEP = Sweep(
    name="h_depth_params",
    config=H_CONFIG,
    axes={},
    arms={"none": ("prores.schedule=none",),
          "forward_false_alpha": ("prores.schedule=linear", "prores.forward=false", "prores.scale_updates=alpha"),
          "depth_mup": ("prores.schedule=none", "model.depth_param=depth_mup", "model.depth_base=4"),
          "completep": ("prores.schedule=none", "model.depth_param=completep", "model.depth_base=4")},
    baseline="none",
    seeds=H_SEEDS,
    common=H_COMMON,
)
