"""Experiment L, stage 1 (pre-registered in docs/preregistered/L.md): is ProRes more than a
depth-ordered LR warmup? Every arm on the LR grid {5e-4, 1e-3, 2e-3, 3e-3}, the global LR warmup at
W = 60 (`none`), 250 and 500 steps, on 2 seeds that stage 2 does not use:

    nice -n 10 python -m andrea_jax.repro.sweep scripts/sweeps/l_stage1.py --jobs 2
    python -m andrea_jax.repro.sweep scripts/sweeps/l_stage1.py --report --out docs/l/stage1

Recipe (L_COMMON): Pre-LN, 24 blocks of width 64 (`tiny`'s init scaled), 2000 steps of 8 x 32
tokens of the documentation corpus, WSD after the arm's LR warmup, ProRes T = 20, validation on 64
batches every 500 steps. A run costs about 2.7 min of a 2-core machine two at a time, so the 88
runs take about 4 h: run them in parts with `--arms` (the same command resumes where a sitting
stopped). Depth-muP's LR is tuned at its base depth, 6 blocks, as its rules prescribe (those runs
cost a quarter); stage 2 runs it at 24 blocks at that LR.
"""
from andrea_jax.repro.sweep import Sweep
from _questions import ON_THE_DOC_CORPUS

N_LAYER = 24
T = 20                                  # linear and reverse: block l's ramp lasts T l (T (L - l + 1)) steps
# equal: every block ramps over T_EQUAL L steps. Each schedule's block-LR deficit, the sum over
# blocks of the steps lost to the ramp, sum_l span_l / 2, is T L (L + 1) / 4 = 3000 block-steps for
# linear and reverse and T_EQUAL L^2 / 2 for equal: T_EQUAL = T (L + 1) / (2 L) = 10.42, which the
# integer prores.warmup rounds to 10 (2880 block-steps, 4% less than the other two).
T_EQUAL = 10
DEPTH_MUP_BASE = 6
LRS = ("5e-4", "1e-3", "2e-3", "3e-3")

RAMP = ("prores.forward=false", "prores.scale_updates=alpha")
ARMS = {
    "none": ("prores.schedule=none",),
    "warmup250": ("prores.schedule=none", "optim.warmup_steps=250"),
    "warmup500": ("prores.schedule=none", "optim.warmup_steps=500"),
    "linear": ("prores.schedule=linear",),
    "linear_alpha": ("prores.schedule=linear", "prores.scale_updates=alpha"),
    "ramp_linear": ("prores.schedule=linear", *RAMP),
    "ramp_equal": ("prores.schedule=equal", f"prores.warmup={T_EQUAL}", *RAMP),
    "ramp_reverse": ("prores.schedule=reverse", *RAMP),
    # Depth-muP (a = 1/2) with its own init rule, block init independent of depth (normal): the
    # branch multiplier (L / L0)^-1/2 does the depth scaling that `scaled` init would do twice.
    "depth_mup": ("prores.schedule=none", "model.depth_param=depth_mup", f"model.depth_base={DEPTH_MUP_BASE}",
                  "model.init=normal"),
    "zero_init_out": ("prores.schedule=none", "model.zero_init_out=true"),
    "gates": ("prores.schedule=none", "model.gates=learned"),
}
TUNED_AT_BASE_DEPTH = {"depth_mup": (f"model.n_layer={DEPTH_MUP_BASE}",)}

L_COMMON = (f"model.n_layer={N_LAYER}", "model.norm=pre", "model.d_model=64", "model.n_head=4",
            "model.seq_len=32", "train.batch_size=8", "train.steps=2000", "optim.schedule=wsd",
            "optim.warmup_steps=60", f"prores.warmup={T}", "train.eval_every=500", "train.eval_batches=64",
            "train.sample_tokens=0", "train.checkpoint_every=500", "diagnostics.tensorboard=false",
            *ON_THE_DOC_CORPUS)
STAGE1_SEEDS = (100, 101)


def lr_arms(lrs: dict, at_base_depth: bool = True) -> dict:
    """ARM_lrLR: ARMS[ARM] at optim.lr = LR for each LR of lrs[ARM]; with `at_base_depth`, the arms
    tuned at a base depth (Depth-muP) train there."""
    return {f"{arm}_lr{lr}": (*ARMS[arm], *(TUNED_AT_BASE_DEPTH.get(arm, ()) if at_base_depth else ()),
                              f"optim.lr={lr}")
            for arm, arm_lrs in lrs.items() for lr in arm_lrs}


SWEEP = Sweep(
    name="l_stage1",
    config="tiny",
    axes={},
    arms=lr_arms({arm: LRS for arm in ARMS}),
    baseline="none_lr1e-3",
    seeds=STAGE1_SEEDS,
    common=L_COMMON,
)
