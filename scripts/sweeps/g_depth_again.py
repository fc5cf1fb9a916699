"""Experiment G again: Pre-LN at 12, 24 and 48 blocks, none against linear ProRes with and without
updates scaled by alpha, with schedules above Adam's own timescale: T = 20 steps (one horizon of
b2 = 0.95), an LR warmup of 60 steps, and 2000 steps, so that the ramp ends by half of the run at
every depth (T L = 240 / 480 / 960 steps), on the documentation corpus, 5 seeds. A step is
Experiment H's 8 x 32 tokens, so a run reads 512k tokens (2% of the corpus):

    python -m andrea_jax.repro.sweep scripts/sweeps/g_depth_again.py --jobs 2 --report

45 runs. Measured two at a time on 2 cores: 3.7 min a run at 12 blocks, 5.4 min at 24 (docs/g/depth_again/),
so about 11 min at 48: 30 min, 42 min and about 80 min for the three groups. A group runs alone with
`--groups n_layer=48`; a sweep stopped at the end of a session resumes where it was when the same
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
          "linear": ("prores.schedule=linear",)},
    baseline="none",
    seeds=(0, 1, 2, 3, 4),
    common=("model.norm=pre", "model.d_model=64", "model.n_head=4", "model.seq_len=32", "train.batch_size=8",
            "train.steps=2000", "optim.lr=3e-3", "optim.schedule=wsd", "optim.warmup_steps=60", "prores.warmup=20",
            "train.eval_every=250", "train.eval_batches=64", "train.sample_tokens=0", "train.checkpoint_every=250",
            "diagnostics.tensorboard=false", *ON_THE_DOC_CORPUS),
)
