"""A tiny ANDREA that trains visibly in a few minutes on 2 CPU cores (the README's main job).

4 blocks of width 128 with the full 8449-token BPE, init scaled, ProRes off: the setting the
measurement supports (docs/RESULTS.md, Experiment C: linear ProRes costs validation loss at every T
tried at this scale). `--set prores.schedule=linear` switches it on with T = 25 (every block fully
on after 100 of the 600 steps) to watch the mechanism.
"""
from andrea_jax.config import Config, ModelConfig, OptimConfig, ProResConfig, TrainConfig


def get_config() -> Config:
    return Config(
        model=ModelConfig(seq_len=128, d_model=128, n_layer=4, n_head=4, init="scaled"),
        prores=ProResConfig(schedule="none", warmup=25),
        optim=OptimConfig(lr=3e-3, warmup_steps=30),
        train=TrainConfig(steps=600, batch_size=16, eval_every=100, eval_batches=4, checkpoint_every=200,
                          sample_tokens=120),
    )
