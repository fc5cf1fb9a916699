"""What the sweeps that test ProRes's controls share: the Debian documentation corpus
(docs/DATA.md, "A corpus that does not repeat"), which these runs read less than once, and
Experiment H's recipe."""
import json
import math
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
# A run reads 1500 x 8 x 32 = 384k tokens: more than the embedded corpus's 0.3M, 1.6% of this one.
CORPUS = os.environ.get("ANDREA_DOC_CORPUS", str(ROOT / "corpora" / "debian_docs_prepared"))
ON_THE_DOC_CORPUS = ("data.source=prepared", f"data.path={CORPUS}", "model.vocab_size=8449")

# Experiment H: Pre-LN at depth 24, width 64; LR 3e-3 after a 60-step warmup, ProRes T = 25 (the
# ramp ends at T L = 600 steps, 40% of the run); 64 validation batches of 8 x 32 tokens.
H_CONFIG = "depth:family=tiny,layers=24"
H_COMMON = ("model.norm=pre", "train.steps=1500", "train.batch_size=8", "model.seq_len=32", "optim.lr=3e-3",
            "optim.warmup_steps=60", "prores.warmup=25", "train.eval_every=250", "train.eval_batches=64",
            "diagnostics.every=25", "diagnostics.spike_window=100", "train.sample_tokens=0",
            "train.checkpoint_every=250", "diagnostics.tensorboard=false", *ON_THE_DOC_CORPUS)
H_SEEDS = (0, 1, 2, 3, 4)

# Experiment A's Post-LN recipe (d 64, 24 blocks, 1500 steps of 8 x 32 tokens, LR 1e-3 after 150
# steps: the paper's 10% LR warmup and its 130M Post-LN LR), on this corpus.
POST_LN_CONFIG = "depth:family=tiny,layers=24"
POST_LN_COMMON = tuple(s for s in H_COMMON if not s.startswith(("optim.", "model.norm=")))
POST_LN_COMMON = ("model.norm=post", "optim.lr=1e-3", "optim.warmup_steps=150", *POST_LN_COMMON)
# The paper's Post-LN protocol (Sec. 4.1, App. A): a 10% LR warmup, LR 1e-3 (130M), and a ProRes
# ramp of 1.2-2.4x the LR warmup: T = 12, T L = 288 = 1.9x (T below Adam's ~20-step horizon, which
# the paper's ratio forces at this run length). The released scripts' protocol: a 2% warmup (2,000
# of 100k), LR 2e-3 (71M, 130M) and T L = 12x the warmup: T = 15, T L = 360.
PAPER_PROTOCOL = ("optim.lr=1e-3", "optim.warmup_steps=150", "prores.warmup=12")
SCRIPTS_PROTOCOL = ("optim.lr=2e-3", "optim.warmup_steps=30", "prores.warmup=15")

# Muon against AdamW (m_muon_*.py): `tiny` (4 Pre-LN blocks, width 128; 600 steps of 16 x 128
# tokens, LR 3e-3 after 30 steps) and Experiment E's recipe (POST_LN_*, schedule none), both on
# this corpus, validated on 32 batches. Muon's AdamW group (embeddings, norms, biases) keeps the
# recipe's optim.lr.
TINY_CONFIG = "tiny"
TINY_COMMON = ("train.eval_every=300", "train.eval_batches=32", "train.sample_tokens=0", "train.checkpoint_every=300",
               "diagnostics.tensorboard=false", *ON_THE_DOC_CORPUS)
MUON_GRID_SEEDS = (100,)            # the grid's seed: none of the paired comparison's
MUON_SEEDS = (0, 1, 2, 3, 4)


def muon_against_adamw(name: str, config: str, common: tuple, adamw_lrs, muon_lrs, baseline_lr: str,
                       seeds=MUON_GRID_SEEDS, arm=()):
    """A Sweep of AdamW at each of `adamw_lrs` (optim.lr) and Muon at each of `muon_lrs`
    (optim.muon_lr), every run with the overrides `arm`, paired against AdamW at `baseline_lr`."""
    from andrea_jax.repro.sweep import Sweep
    return Sweep(name=name, config=config, axes={},
                 arms={**{f"adamw_lr{lr}": (*arm, f"optim.lr={lr}") for lr in adamw_lrs},
                       **{f"muon_lr{lr}": (*arm, "optim.name=muon", f"optim.muon_lr={lr}") for lr in muon_lrs}},
                 baseline=f"adamw_lr{baseline_lr}", seeds=seeds, common=common)


def best_lrs(reports: dict, lrs: dict, seeds: tuple) -> dict:
    """{arm: the LR of lrs[arm] whose runs ARM_lrLR_sSEED on `seeds` have the lowest mean final
    validation loss in the kept reports {summary.json path: experiment} (a tie goes to the LR listed
    first). A run that diverged counts as an infinite loss: an LR that diverges is never an arm's best."""
    from andrea_jax.errors import ConfigError
    runs = {}
    for summary_path, experiment in reports.items():
        try:
            runs.update(json.loads(pathlib.Path(summary_path).read_text())["experiments"][experiment]["runs"])
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"{summary_path}: no report of {experiment} to choose the LRs from ({e!r}); "
                              f"run that sweep with --report first") from None

    def mean_loss(arm, lr):
        losses = []
        for seed in seeds:
            run = runs.get(f"{arm}_lr{lr}_s{seed}", {"outcome": "not run"})
            if run["outcome"] not in ("finished", "diverged"):
                raise ConfigError(f"{arm}_lr{lr}_s{seed} is {run['outcome']} in {list(reports)}, so {arm}'s "
                                  f"best LR is not known yet")
            loss = run["final_val_loss"] if run["outcome"] == "finished" else None
            losses.append(loss if loss is not None and math.isfinite(loss) else math.inf)
        return sum(losses) / len(losses)

    return {arm: min(choices, key=lambda lr: mean_loss(arm, lr)) for arm, choices in lrs.items()}
