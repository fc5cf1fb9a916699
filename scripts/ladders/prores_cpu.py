"""The CPU compute ladder of ProRes's better setting: Pre-LN at 12 blocks, widths 32, 48, 64 and 96,
no ProRes against linear ProRes with updates scaled by alpha (`linear_alpha`, the arm that beat
`linear` in Experiments G and H), 3 seeds, on the documentation corpus with Experiment G's recipe
(steps of 8 x 32 tokens, LR 3e-3 after 60 steps, WSD, T = 20), each rung trained on 1 token per
parameter (andrea_jax/repro/ladder.py counts the matmul weights, the tied 8449 x D embedding included):
1632, 2880, 4416 and 8352 steps, 0.42M to 2.1M tokens (under 10% of the corpus), 24 runs:

    python -m andrea_jax.repro.ladder scripts/ladders/prores_cpu.py --jobs 2
    python -m andrea_jax.repro.ladder scripts/ladders/prores_cpu.py --jobs 2 --rungs d32 d48   # a part
    python -m andrea_jax.repro.ladder scripts/ladders/prores_cpu.py --report

One LR at every width: under the standard parameterisation the best LR falls with width, which at
3x of width moves the baseline and the arm alike, so it bends both laws rather than the multiplier.
"""
import pathlib
import runpy

from andrea_jax.repro.ladder import Ladder

_QUESTIONS = runpy.run_path(str(pathlib.Path(__file__).resolve().parents[1] / "sweeps" / "_questions.py"))

LADDER = Ladder(
    name="prores_cpu",
    config="tiny",
    rungs={f"d{width}": (f"model.d_model={width}",) for width in (32, 48, 64, 96)},
    arms={"none": ("prores.schedule=none",),
          "linear_alpha": ("prores.schedule=linear", "prores.scale_updates=alpha")},
    baseline="none",
    seeds=(0, 1, 2),
    tokens_per_param=1.0,
    common=("model.norm=pre", "model.n_layer=12", "model.n_head=4", "model.seq_len=32", "train.batch_size=8",
            "optim.lr=3e-3", "optim.schedule=wsd", "optim.warmup_steps=60", "prores.warmup=20",
            "train.eval_every=250", "train.eval_batches=64", "train.sample_tokens=0", "train.checkpoint_every=250",
            "diagnostics.tensorboard=false", *_QUESTIONS["ON_THE_DOC_CORPUS"]),
)
