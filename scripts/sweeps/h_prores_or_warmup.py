"""Experiment H, part 1: at Pre-LN depth 24, is scaled ProRes's gain ProRes or a learning-rate
warmup? The arms that need no depth parameterisation (part 2: h_depth_params.py), 5 seeds:

    python -m andrea_jax.repro.sweep scripts/sweeps/h_prores_or_warmup.py --jobs 2 --report

- none, and none with the LR warmup stretched to T (L + 1) / 2 = 312 steps: the mean step at which
  a block's ramp ends, so the global warmup lasts as long as ProRes's on average;
- linear (the paper), linear with updates scaled by alpha, and the same at T = 50;
- gates (ReZero: a learned scalar per block from 0), the positive control.
"""
from andrea_jax.repro.sweep import Sweep
from _questions import H_COMMON, H_CONFIG, H_SEEDS

SWEEP = Sweep(
    name="h_prores_or_warmup",
    config=H_CONFIG,
    axes={},
    arms={"none": ("prores.schedule=none",),
          "none_warmup312": ("prores.schedule=none", "optim.warmup_steps=312"),
          "linear": ("prores.schedule=linear",),
          "linear_alpha": ("prores.schedule=linear", "prores.scale_updates=alpha"),
          "linear_alpha_T50": ("prores.schedule=linear", "prores.scale_updates=alpha", "prores.warmup=50"),
          "gates": ("prores.schedule=none", "model.gates=learned")},
    baseline="none",
    seeds=H_SEEDS,
    common=H_COMMON,
)
