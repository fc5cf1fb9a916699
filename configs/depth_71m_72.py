"""Depth sweep, family 71m, 72 layers (see configs/_depth.py)."""
from configs._depth import depth_config


def get_config():
    return depth_config("71m", 72)
