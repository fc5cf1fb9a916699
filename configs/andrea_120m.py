"""ANDREA-120M (the ANDREA document): 12 blocks, d_model 768, 12 heads, GELU MLP 4x, tied embeddings, vocab 8449.

92,331,264 parameters. The name comes from the source document's "about 120M", which counts the
tied embedding twice; the true count is what the code reports. Optimizer and ProRes follow the
ProRes paper's setup: AdamW (0.9, 0.95), wd 0.1, clip 1.0, WSD with 2000 warmup steps and a
linear decay over the last 10%, batch 512 x 1024, 100k steps, linear ProRes with T = 1000, bf16.

Data: the embedded tinyshakespeare by default, which holds only 293 windows of 1025 tokens, fewer
than one batch: the run stops saying so. For a smoke run anywhere add `--set train.batch_size=2
--set train.steps=2`; for real training prepare a web-size corpus once with
`python -m andrea_jax.data.prepare` and point `data.source=prepared` at it (docs/DATA.md, "Train
ANDREA-120M for real").
"""
from andrea_jax.config import Config, ModelConfig, OptimConfig


def get_config() -> Config:
    """The schema's defaults are this model and its training; it computes in bfloat16 with WSD."""
    return Config(model=ModelConfig(dtype="bfloat16"), optim=OptimConfig(schedule="wsd"))
