"""The depth-sweep families of the paper's depth experiment (ProRes paper: depths 12-120).

`--config depth:family=71m,layers=48` builds one member (`get_config("family=71m,layers=48")`).
Placement, init and schedule are overridden per run, e.g. `--set model.norm=post --set prores.schedule=none`.

- `71m`: the paper's 71M-family width, d_model 512 and 8 heads, with the ProRes paper's setup:
  sequences of 1024, batch 512, 100k steps, AdamW (0.9, 0.95) wd 0.1 clip 1.0, WSD with 2000
  warmup steps and a linear decay over the last 10%, bf16, linear ProRes with T = 1000
  (T = 500 at 96 and 120 layers, as in the paper), peak LR 2e-3 (the official ProRes scripts'
  value for the 71M family). Our vocabulary is the 8449-token ANDREA BPE, not the paper's
  tokenizer, so the parameter count at 12 layers is below 71M. Blocks are rematerialised.
- `tiny`: the same depths at d_model 64, 4 heads, sequences of 64, a 2048-token BPE, batch 16,
  300 steps: trains on 2 CPU cores. Schedules are scaled in proportion to the paper's: LR warmup
  5% of the run, decay over the last 10%, ProRes T = 1% of the run, 0.5% at 96 and 120 layers
  (the paper's 1000 and 500 of 100k; T L / steps = 0.24 at 24 layers, as 1000 x 24 / 100k; at
  120 layers the warmup fills most of the run, as in the paper). Diagnostics every 10 steps.
"""
from andrea_jax.config import (Config, ConfigError, DiagnosticsConfig, ModelConfig, OptimConfig, ProResConfig,
                               TrainConfig)

DEPTHS = (12, 24, 48, 72, 96, 120)
FAMILIES = ("71m", "tiny")


def depth_config(family: str, n_layer: int) -> Config:
    if family == "71m":  # the rest is the schema's defaults, the ProRes paper's setup
        return Config(
            model=ModelConfig(d_model=512, n_layer=n_layer, n_head=8, dtype="bfloat16", remat="full"),
            prores=ProResConfig(warmup=500 if n_layer >= 96 else 1000),
            # Peak LR 2e-3: the official scripts' value for the whole 71M depth family.
            optim=OptimConfig(lr=2e-3, schedule="wsd"),
            diagnostics=DiagnosticsConfig(every=250),
        )
    if family == "tiny":
        steps = 300
        warmup = max(1, round(steps * (0.005 if n_layer >= 96 else 0.01)))
        return Config(
            model=ModelConfig(vocab_size=2048, seq_len=64, d_model=64, n_layer=n_layer, n_head=4),
            prores=ProResConfig(warmup=warmup),
            optim=OptimConfig(lr=3e-3, schedule="wsd", warmup_steps=steps // 20),
            train=TrainConfig(steps=steps, batch_size=16, eval_every=50, eval_batches=4),
            diagnostics=DiagnosticsConfig(every=10, spike_window=50),
        )
    raise ValueError(f"unknown depth family {family!r}; known: {', '.join(FAMILIES)}")


def get_config(arg: str = "") -> Config:
    """`arg` is `family=F,layers=L` with F in FAMILIES and L in DEPTHS."""
    fields = dict(part.partition("=")[::2] for part in arg.split(",") if part)
    unknown = sorted(set(fields) - {"family", "layers"})
    if unknown or not {"family", "layers"} <= set(fields):
        raise ConfigError(f"config depth takes family=F,layers=L (got {arg!r}); e.g. depth:family=tiny,layers=24")
    family, layers = fields["family"], fields["layers"]
    if family not in FAMILIES or not layers.isdigit() or int(layers) not in DEPTHS:
        raise ConfigError(f"config depth: family must be one of {', '.join(FAMILIES)} and layers one of "
                          f"{', '.join(map(str, DEPTHS))} (got family={family!r}, layers={layers!r})")
    return depth_config(family, int(layers))
