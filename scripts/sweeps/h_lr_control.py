"""Experiment H, the control that could explain it away: every arm of H that beats `none` also
lowers the early or the hidden learning rate of the deep blocks (a longer warmup, a per-block
ramp, Depth-µP's hidden LR 3e-3 (4 / 24)^(1/2) = 1.2e-3), and H's LR 3e-3 was chosen on the
4-block `tiny`. So `none` at a lower LR, the same recipe and seeds (h_prores_or_warmup.py), paired
with H's arms across the reports (`python -m andrea_jax.repro.compare`):

    python -m andrea_jax.repro.sweep scripts/sweeps/h_lr_control.py --jobs 2 --report
"""
from andrea_jax.repro.sweep import Sweep
from _questions import H_COMMON, H_CONFIG, H_SEEDS

SWEEP = Sweep(
    name="h_lr_control",
    config=H_CONFIG,
    axes={},
    arms={"none_lr1e-3": ("prores.schedule=none", "optim.lr=1e-3")},
    baseline="none_lr1e-3",  # its own: the pairs are with H's arms, across the reports
    seeds=H_SEEDS,
    common=H_COMMON,
)
