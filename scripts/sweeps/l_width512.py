"""EXPLORATORY: Experiment L's five key arms at width 512 (8 heads) instead of 64, on one GPU.
Designed after L's stage 1 had chosen its LRs, on one seed, and not pre-registered
(docs/preregistered/L.md is the pre-registration, and this is no part of it). What it can say:
whether each arm, at its own best LR of the grid, lands above or below the others at this width.
It compares best-LR against best-LR per arm on seed 0 and says nothing about L's primary contrasts,
which are paired over 16 seeds at width 64.

The arms are the ones L's primary contrasts (a), (b) and (c) compare: `none`, the best warmup by
L's rule (`_l_choice.choose`: `warmup1000`), `linear`, `ramp_linear` and `ramp_equal`, with the
settings l_stage1.py and _l_choice.py give them. Each is trained on the LR grid {3e-4, 1e-3, 3e-3}:
L's best LRs at width 64 are 1e-3 to 4e-3, and at 8x the width Adam's best LR moves down, which the
grid brackets from 3e-3 to 10x lower. 15 runs. The recipe is L's (L_COMMON: Pre-LN, 24 blocks,
2000 steps of 8 x 32 tokens, WSD after a 60-step warmup unless the arm's W differs, ProRes T = 20,
64 validation batches every 500 steps) but for:
- `model.d_model=512`, `model.n_head=8` (heads 64 wide, GPT-2's; L's 4 heads are 16 wide);
- the data: every 8th document of L's corpus (scripts/gpu_corpus.sh writes it into .gpu_corpus,
  3.27M tokens of L's tokenizer; ANDREA_GPU_CORPUS names another folder). The GPU machine cannot
  take L's whole prepared corpus, and a run reads a sixth of the subset's training part, so no
  token is read twice; but the documents, and the validation tail, are not L's, so absolute losses
  are not comparable with L's;
- no checkpoints: the GPU machine starts bare and is given back after the call, so a checkpoint
  could neither resume a run nor come back, and 15 runs of 80M parameters would keep about 40 GB.

How it fits one device call of at most 8 minutes on an H200 (a plan, not a measurement): the three
LRs of one arm differ only in optim.lr, which a population takes per member, so `--pack 3` trains
each arm as one process (5 processes), and `--jobs 3` runs 3 of them at once on the GPU, in two
waves. A 24-block width-512 step of 3 x 256 tokens is far too small to fill the GPU, so the planned
cost is start-up and compilation (about a minute a process) and per-step latency (2000 steps at
10-20 ms), about 2 minutes a process alone, 5-6 minutes for the two waves sharing the GPU.

    bash scripts/gpu_corpus.sh corpora/debian_docs corpora/debian_docs_prepared   # here, once
    bash scripts/gpu_wheels.sh                                                      # here, once
    device run, carry [".whl", ".gpu_corpus"]:  bash scripts/gpu_width.sh
    python -m andrea_jax.repro.sweep scripts/sweeps/l_width512.py --runs RUNS --jobs 3 --pack 3  # what it runs
"""
import os

from andrea_jax.repro.sweep import Sweep
from _l_choice import EXTRA_ARMS, choose
from _questions import ROOT
from l_stage1 import ARMS, L_COMMON

_, BEST_WARMUP, _ = choose()
KEY_ARMS = ("none", BEST_WARMUP, "linear", "ramp_linear", "ramp_equal")
LRS = ("3e-4", "1e-3", "3e-3")
SETTINGS = {**ARMS, **EXTRA_ARMS}
CORPUS = os.environ.get("ANDREA_GPU_CORPUS", str(ROOT / ".gpu_corpus"))
# L_COMMON with the width, the corpus and the checkpoints replaced in place: every other setting stays L's.
REPLACED = {"model.d_model": "512", "model.n_head": "8", "data.path": CORPUS, "train.checkpoint_every": "0"}
COMMON = tuple(f"{key}={REPLACED[key]}" if key in REPLACED else f"{key}={value}"
               for key, value in (s.split("=", 1) for s in L_COMMON))
assert all(any(s.startswith(f"{key}=") for s in L_COMMON) for key in REPLACED), "L_COMMON lost a replaced key"

SWEEP = Sweep(
    name="l_width512",
    config="tiny",
    axes={},
    # arm-major, LRs low first: --pack 3 makes one population of each arm's three LRs, and --toy's
    # first two runs are `none` at two LRs, one of them the baseline
    arms={f"{arm}_lr{lr}": (*SETTINGS[arm], f"optim.lr={lr}") for arm in KEY_ARMS for lr in LRS},
    baseline="none_lr1e-3",   # the report's pairing; the reading is each arm's best LR against another's
    seeds=(0,),
    common=COMMON,
)
