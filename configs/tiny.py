"""A tiny ANDREA that trains visibly in a few minutes on 2 CPU cores (the README's main job).

4 blocks of width 128 with the full 8449-token BPE; ProRes linear with T = 25, so every block is
fully on after 100 of the 600 steps: a demo of the mechanism, not of a gain. Measured (docs/RESULTS.md,
Experiment C, init scaled, 2 seeds, validation loss after 600 steps): this setting costs +0.226
[+0.195, +0.256] nats against no ProRes (5.119), and every T from 10 to 250 costs 0.19-0.26 nats;
`--set prores.schedule=none --set model.init=scaled` trains the better model at this scale.
"""
from andrea_jax.config import (Config, DataConfig, ModelConfig, OptimConfig, ProResConfig,
                               TrainConfig)


def get_config() -> Config:
    return Config(
        model=ModelConfig(vocab_size=8449, seq_len=128, d_model=128, n_layer=4, n_head=4),
        prores=ProResConfig(schedule="linear", warmup=25),
        optim=OptimConfig(lr=3e-3, schedule="cosine", warmup_steps=30),
        train=TrainConfig(steps=600, batch_size=16, log_every=10, eval_every=100, eval_batches=4,
                          checkpoint_every=200,
                          sample_tokens=120),
        data=DataConfig(source="embedded"),
    )
