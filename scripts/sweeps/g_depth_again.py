"""Experiment G again: Pre-LN at 12, 24 and 48 blocks, none against linear ProRes with and without
updates scaled by alpha, with schedules above Adam's own timescale: T = 20 steps (one horizon of
b2 = 0.95), an LR warmup of 60 steps, and 2000 steps, so that the ramp ends by half of the run at
every depth (T L = 240 / 480 / 960 steps), on the documentation corpus, 5 seeds. A step is
Experiment H's 8 x 32 tokens, so a run reads 512k tokens (2% of the corpus):

    python -m andrea_jax.repro.sweep scripts/sweeps/g_depth_again.py --jobs 2 --arms none linear linear_alpha
    python -m andrea_jax.repro.sweep scripts/sweeps/g_depth_again.py --jobs 2 --groups n_layer=48 --arms warmup_490
    python -m andrea_jax.repro.sweep scripts/sweeps/g_depth_again.py --report

The warmup control's 490 steps are ProRes's mean ramp at 48 blocks only, so it runs in that group;
the whole sweep without --arms would also train it at 12 and 24 blocks.

Measured two at a time on 2 cores (docs/g/depth_again/): 3.7 min a run at 12 blocks, 5.4 at 24 and
8.2 at 48, so 29, 42 and 64 min of wall time for the three arms' 15 runs per group, and 22 min for
the 48-block warmup control. A group or an arm runs alone with `--groups n_layer=48` or
`--arms warmup_490`; a sweep stopped at the end of a session resumes where it was when the same
command runs again.
"""
from andrea_jax.repro.sweep import Sweep
from _questions import ON_THE_DOC_CORPUS

SWEEP = Sweep(
    name="g_depth_again",
    config="tiny",
    axes={"model.n_layer": [12, 24, 48]},
    arms={"none": ("prores.schedule=none",),
          "linear_alpha": ("prores.schedule=linear", "prores.scale_updates=alpha"),
          "linear": ("prores.schedule=linear",),
          # the control that could explain a gain away: no ProRes, the LR warmup stretched to
          # ProRes's mean ramp at 48 blocks, T (L + 1) / 2 = 490 steps (run with --groups n_layer=48)
          "warmup_490": ("prores.schedule=none", "optim.warmup_steps=490")},
    baseline="none",
    seeds=(0, 1, 2, 3, 4),
    common=("model.norm=pre", "model.d_model=64", "model.n_head=4", "model.seq_len=32", "train.batch_size=8",
            "train.steps=2000", "optim.lr=3e-3", "optim.schedule=wsd", "optim.warmup_steps=60", "prores.warmup=20",
            "train.eval_every=250", "train.eval_batches=64", "train.sample_tokens=0", "train.checkpoint_every=250",
            "diagnostics.tensorboard=false", *ON_THE_DOC_CORPUS),
)
