"""The reproduction's experiments: which config, which arms, which overrides (pure data).

Every run is `python train.py --config CONFIG --set ...`: the experiment's common overrides, then
its arm's, then the seed. Scale choices (width, steps, batch) are what fits about 40 minutes of a
2-core machine shared with other work; each is stated in `scale` and in the report.
"""
from __future__ import annotations

import dataclasses

# Not saved, not needed: a run is short and restarts from scratch when stopped.
_QUIET = ("train.checkpoint_every=0", "diagnostics.tensorboard=false")


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    config: str
    arms: dict            # arm name -> tuple of extra overrides
    common: tuple         # overrides of every run
    seeds: tuple
    baseline: str         # the arm every paired difference is taken against
    paper: str            # what it is set against (the ProRes paper)
    scale: str            # the scale choice, in words
    precheck_steps: int = 0   # > 0: first a short run of the first two arms that prints the gradient ratio
    precheck_sets: tuple = ()
    sweeps_t: bool = False    # arms T<k> are linear ProRes with T = k: report loss against T L / steps
    command: str = ""         # how to rerun it, when not `scripts/reproduce_prores.py --experiment NAME` (sweeps)

    def steps(self) -> int:
        return int(dict(s.split("=", 1) for s in self.common)["train.steps"])


# Batches of 8 x 32 tokens, evaluated on 32 batches every 100 steps, diagnostics every 25 steps.
_SMALL_BATCHES = ("train.batch_size=8", "model.seq_len=32", "train.eval_every=100", "train.eval_batches=32",
                  "diagnostics.every=25", "diagnostics.spike_window=100", *_QUIET)

ABLATION = Experiment(
    name="ablation",
    title="Experiment A: Post-LN schedule ablation at depth 24",
    config="depth:family=tiny,layers=24",
    arms={"none": ("prores.schedule=none",), "linear": ("prores.schedule=linear",),
          "equal": ("prores.schedule=equal",), "reverse": ("prores.schedule=reverse",)},
    common=("model.norm=post", "optim.lr=1e-3", "optim.warmup_steps=150", "prores.warmup=25",
            "train.steps=1500", *_SMALL_BATCHES),
    seeds=(0, 1, 2),
    baseline="none",
    paper="350M, L = 24, Post-LN (ProRes paper): baseline 16.83, linear 15.15, equal and reverse diverge",
    scale=("d_model 64, 4 heads, 24 Post-LN blocks, 2048-token BPE; 1500 steps of 8 x 32 tokens "
           "(384k tokens, about one pass over the corpus; a batch small enough for about 40 minutes "
           "of a loaded 2-core machine); AdamW as the paper, "
           "peak LR 1e-3 after a "
           "150-step linear warmup, WSD decay over the last 10%; ProRes T = 25 (T L = 600 steps, "
           "40% of the run; T above Adam's ~20-step horizon at b2 = 0.95)"),
    precheck_steps=150,
    precheck_sets=("train.steps=150", "diagnostics.every=10", "train.eval_every=150"),
)

STABILITY = Experiment(
    name="stability",
    title="Experiment B: Pre-LN stability at a high learning rate",
    config="depth:family=tiny,layers=24",
    arms={"none": ("prores.schedule=none",), "linear": ("prores.schedule=linear",),
          "gates": ("prores.schedule=none", "model.gates=learned")},
    common=("model.norm=pre", "optim.lr=3e-3", "optim.warmup_steps=100", "prores.warmup=25",
            "train.steps=1000", *_SMALL_BATCHES),
    seeds=(0, 1, 2),
    baseline="none",
    paper=("depth 12-120 (ProRes paper): loss spikes near zero with ProRes, activation norms growing "
           "about linearly with depth instead of exponentially; learned gates (ReZero) have no "
           "published ProRes comparison"),
    scale=("d_model 64, 4 heads, 24 Pre-LN blocks; 1000 steps of 8 x 32 tokens; peak LR 3e-3 (3x "
           "Experiment A) after a 100-step warmup; ProRes T = 25; gates: a trainable scalar per "
           "block from 0 (ReZero), ProRes off"),
)

T_SWEEP = Experiment(
    name="tsweep",
    title="Experiment C: where ProRes starts to pay on the README's `tiny` config",
    config="tiny",
    arms={"none": ("prores.schedule=none",),
          **{f"T{T}": ("prores.schedule=linear", f"prores.warmup={T}") for T in (10, 25, 100, 250)}},
    common=("model.init=scaled", "train.steps=600", "train.eval_batches=123", "train.batch_size=16",
            "train.sample_tokens=0", *_QUIET),
    seeds=(0, 1),
    baseline="none",
    sweeps_t=True,
    paper="no published number: the question is at which T x L / steps ProRes stops costing loss",
    scale=("`tiny` (4 blocks of width 128, init scaled, 600 steps of 16 x 128 tokens, LR 3e-3 with a "
           "30-step warmup); validation over all 123 windows. Rerun the best and worst T with "
           "`--arms NONE_AND_T --set train.steps=1800 --runs DIR` for 3x the steps "
           "(docs/prores_repro/tsweep_3x/REPORT.md)"),
)

# Experiment A's setup with T as the variable: Post-LN with linear ProRes stays on the plateau at
# T = 25 (T L = 600 steps, 4x the LR warmup); does the failure follow T L against the warmup?
POST_LN_T_SWEEP = dataclasses.replace(
    ABLATION,
    name="postln_tsweep",
    title="Experiment D: Post-LN at depth 24, linear ProRes against T",
    arms={"none": ("prores.schedule=none",),
          **{f"T{T}": ("prores.schedule=linear", f"prores.warmup={T}") for T in (2, 5, 10, 25)}},
    common=tuple(s for s in ABLATION.common if not s.startswith("prores.warmup=")),
    seeds=(0, 1, 2),
    sweeps_t=True,
    paper="no published number: Experiment A's failure of linear ProRes (T = 25), traced in T; "
          "the paper's regime has T L = 12x its LR warmup (24,000 / 2,000 steps)",
    scale=("Experiment A's (d_model 64, 24 Post-LN blocks, 1500 steps of 8 x 32 tokens, peak LR 1e-3 "
           "after a 150-step warmup); T in {2, 5, 10, 25}, so T L = 48, 120, 240 and 600 steps: "
           "0.3x, 0.8x, 1.6x and 4x the LR warmup"),
    precheck_steps=0,
)

# prores.scale_updates multiplies block l's AdamW update by alpha_l (or its square root),
# a deviation from the paper. Arms: the paper's linear ProRes and the two scalings, beside none.
_SCALED_ARMS = {"none": ("prores.schedule=none",), "linear": ("prores.schedule=linear",),
                "linear_alpha": ("prores.schedule=linear", "prores.scale_updates=alpha"),
                "linear_sqrt_alpha": ("prores.schedule=linear", "prores.scale_updates=sqrt_alpha")}

SCALED_POST_LN = dataclasses.replace(
    ABLATION,
    name="postln_scaled",
    title="Experiment E: Post-LN at depth 24, linear ProRes with its updates scaled by alpha",
    arms=_SCALED_ARMS,
    paper=("no published number: neither the paper nor its code scales updates; Experiment A's "
           "linear arm (T = 25) stayed on the unigram plateau in 3 of 3 seeds"),
    scale=ABLATION.scale + "; prores.scale_updates none / alpha / sqrt_alpha on the linear arm",
    precheck_steps=0,
)

# The same arms on the official code's block (model.family=llama: RMSNorm, SwiGLU, RoPE, no biases,
# untied head), to see whether that block is trapped on the plateau the same way.
SCALED_POST_LN_LLAMA = dataclasses.replace(
    SCALED_POST_LN,
    name="postln_scaled_llama",
    title="Experiment E (llama): Experiment E on the official code's Llama block",
    common=(*SCALED_POST_LN.common, "model.family=llama"),
    scale=SCALED_POST_LN.scale + "; model.family=llama (RMSNorm, SwiGLU of width 4 d, RoPE, no biases, untied head)",
)


def _scaled_post_ln_with(setting: str, was: str, scale: tuple[str, str], **changes) -> Experiment:
    """Experiment E with its common setting `was` replaced by `setting`, and its scale line
    (`scale`: the words replaced, their replacement) saying so."""
    common = tuple(setting if s == was else s for s in SCALED_POST_LN.common)
    return dataclasses.replace(SCALED_POST_LN, common=common, scale=SCALED_POST_LN.scale.replace(*scale), **changes)


# The noise test: do the scalings still matter when 8x the batch divides the gradient noise?
SCALED_POST_LN_8X = _scaled_post_ln_with(
    "train.batch_size=64", was="train.batch_size=8",
    scale=("8 x 32 tokens", "64 x 32 tokens (8x Experiment E's batch)"),
    name="postln_scaled_8x", title="Experiment E (noise): Experiment E at 8x the batch")

# The delay-or-trap test: does linear ProRes leave the plateau given 3x the steps?
SCALED_POST_LN_LONG = _scaled_post_ln_with(
    "train.steps=4500", was="train.steps=1500", scale=("1500 steps", "4500 steps (3x Experiment E)"),
    name="postln_scaled_long", title="Experiment E (delay or trap): Experiment E's arms for 4500 steps",
    arms={k: v for k, v in _SCALED_ARMS.items() if k != "linear_sqrt_alpha"})

SCALED_TINY = dataclasses.replace(
    T_SWEEP,
    name="tiny_scaled",
    title="Experiment F: Pre-LN `tiny` (init scaled), linear ProRes with and without update scaling",
    arms={"none": ("prores.schedule=none",),
          **{f"T{T}{suffix}": ("prores.schedule=linear", f"prores.warmup={T}", *extra)
             for T in (25, 250) for suffix, extra in (("", ()), ("_alpha", ("prores.scale_updates=alpha",)))}},
    common=(*T_SWEEP.common, "diagnostics.every=25"),
    seeds=(0, 1, 2),
    sweeps_t=False,
    paper="no published number: does scaled ProRes stop costing on Pre-LN, or pay?",
    scale=T_SWEEP.scale.split(". Rerun")[0] + "; T = 25 and 250, each with and without prores.scale_updates=alpha",
)


def _depth_scaled(n_layer: int) -> Experiment:
    return Experiment(
        name=f"depth_scaled_{n_layer}",
        title=f"Experiment G: Pre-LN at depth {n_layer}, none against linear ProRes with and without updates scaled",
        config=f"depth:family=tiny,layers={n_layer}",
        # linear last: the paper's unscaled ProRes, the arm its depth claim is about (run after the first two)
        arms={"none": ("prores.schedule=none",),
              "linear_alpha": ("prores.schedule=linear", "prores.scale_updates=alpha"),
              "linear": ("prores.schedule=linear",)},
        common=("model.norm=pre", "train.steps=300", "train.sample_tokens=0", *_QUIET),  # the config's 300, stated
        seeds=(0, 1, 2),
        baseline="none",
        paper=("ProRes paper, depth 12-120 (71M family, Pre-LN): ProRes's gain over the baseline "
               "grows with depth, for unscaled ProRes"),
        scale=(f"the tiny depth family (d_model 64, 4 heads, {n_layer} Pre-LN blocks, 300 steps of "
               "16 x 64 tokens, LR 3e-3, WSD, ProRes T = 1% of the run, as configs/depth.py)"),
    )


# Is the CPU's Post-LN trap a small-width effect? Experiment E unchanged but for the width (d_model
# 512, 8 heads), at its LR and at 3e-4, seed 0: 6 runs, for a GPU, 3 processes at once
# (XLA_PYTHON_CLIENT_PREALLOCATE=false). Its runs are train.py on the embedded corpus, so the machine
# needs the data stack (grain, tensorflow-datasets, array-record, tokenizers). Its size (about 6
# minutes of one H200) is a plan, not a measurement.
_WIDTH_ARMS = {k: _SCALED_ARMS[k] for k in ("none", "linear_alpha", "linear")}  # linear_alpha 2nd: --toy runs it
SCALED_POST_LN_WIDTH_512 = dataclasses.replace(
    SCALED_POST_LN,
    name="postln_scaled_width512",
    title="GPU: Experiment E at width 512 (8 heads), LR 1e-3 and 3e-4",
    arms={**_WIDTH_ARMS, **{f"{k}_lr3e-4": (*v, "optim.lr=3e-4") for k, v in _WIDTH_ARMS.items()}},
    common=(*SCALED_POST_LN.common, "model.d_model=512", "model.n_head=8"),
    seeds=(0,),
    paper="no published number: does Experiment E's trap (CPU, width 64) persist at width 512?",
    scale=SCALED_POST_LN.scale + "; width 512 with 8 heads, seed 0; the _lr3e-4 arms at peak LR 3e-4 "
          "(compare them with none_lr3e-4)",
)

EXPERIMENTS = {e.name: e for e in (ABLATION, STABILITY, T_SWEEP, POST_LN_T_SWEEP, SCALED_POST_LN,
                                   SCALED_POST_LN_LLAMA, SCALED_POST_LN_8X, SCALED_POST_LN_LONG, SCALED_TINY,
                                   *(_depth_scaled(n) for n in (12, 24, 48)),
                                   SCALED_POST_LN_WIDTH_512)}

# A few steps of a 2-layer model of width 64: the end-to-end test of the script, not an experiment.
TOY_SETS = ("model.n_layer=2", "model.d_model=64", "train.steps=4", "train.batch_size=2", "model.seq_len=16",
            "train.eval_every=2", "train.eval_batches=1", "diagnostics.every=2", "diagnostics.spike_window=2")


def toy(experiment: Experiment) -> Experiment:
    """The experiment shrunk to its first two arms, one seed and a few steps of a 2-layer model of width 64,
    without its precheck (a second round of compiles would double the test's time)."""
    arms = dict(list(experiment.arms.items())[:2])
    keep = [s for s in experiment.common if s.split("=")[0] not in {t.split("=")[0] for t in TOY_SETS}]
    return dataclasses.replace(experiment, arms=arms, seeds=(0,), common=(*keep, *TOY_SETS),
                               scale="toy: a 2-layer model for 4 steps (a smoke test of the script, not a result)",
                               precheck_steps=0)


def run_sets(experiment: Experiment, arm: str, seed: int, extra=()) -> list:
    return [*experiment.common, *experiment.arms[arm], f"train.seed={seed}", *extra]
