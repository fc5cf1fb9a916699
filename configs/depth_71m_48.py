"""Depth sweep, family 71m, 48 layers (built by configs/_depth.py).

Sources: d_model 512, 8 heads, sequences of 1024, batch 512, 100k steps, AdamW (0.9, 0.95) wd 0.1
clip 1.0, WSD with 2000 warmup steps and a linear decay over the last 10%, bf16: the paper's setup
(SPEC 2). Peak LR 2e-3 and linear ProRes with T = 1000 (1000 up to 72 layers, 500 at 96 and 120):
the official ProRes scripts for the 71M depth family (SPEC 2, "Facts from the official ProRes
code").
"""
from configs._depth import depth_config


def get_config():
    return depth_config("71m", 48)
