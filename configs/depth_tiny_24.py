"""Depth sweep, family tiny, 24 layers (see configs/_depth.py)."""
from configs._depth import depth_config


def get_config():
    return depth_config("tiny", 24)
