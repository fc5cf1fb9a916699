"""A tiny ANDREA that trains visibly in a few minutes on 2 CPU cores (the README's main job).

4 blocks of width 128 with the full 8449-token BPE, init scaled, ProRes off. The setting is the
one the measurement supports (docs/RESULTS.md, Experiment C, 2 seeds, validation loss over all 123
windows after 600 steps): no ProRes reaches 5.119 (5.098 and 5.140), and linear ProRes costs
+0.258 [+0.187, +0.328] nats at T = 10, +0.226 [+0.195, +0.256] at T = 25, +0.234 at T = 100 and
+0.193 [+0.181, +0.205] at T = 250. At 3x the steps (1800, 2 seeds) the best validation loss of
T = 10 and T = 250 is still +0.157 [+0.095, +0.219] and +0.280 [+0.237, +0.322] behind no ProRes
(4.966). At this scale ProRes does not pay; with this setting the demo's run reaches validation
loss 5.1007 over the whole val split (`python -m andrea_jax.evaluate --workdir runs/tiny`).
To watch the mechanism anyway, `--set prores.schedule=linear` switches it on with T = 25 (every
block fully on after 100 of the 600 steps).
"""
from andrea_jax.config import (Config, DataConfig, ModelConfig, OptimConfig, ProResConfig,
                               TrainConfig)


def get_config() -> Config:
    return Config(
        model=ModelConfig(vocab_size=8449, seq_len=128, d_model=128, n_layer=4, n_head=4,
                          init="scaled"),
        prores=ProResConfig(schedule="none", warmup=25),
        optim=OptimConfig(lr=3e-3, schedule="cosine", warmup_steps=30),
        train=TrainConfig(steps=600, batch_size=16, log_every=10, eval_every=100, eval_batches=4,
                          checkpoint_every=200,
                          sample_tokens=120),
        data=DataConfig(source="embedded"),
    )
