"""model.depth_param: the depth parameterisations Depth-muP (Yang et al., Tensor Programs VI,
arXiv 2310.02244; a = 1/2) and CompleteP (Dey et al., arXiv 2505.01618; a = 1), at the base
width, as the CompleteP code (EleutherAI/nanoGPT-mup, branch completep) sets them for a depth
multiplier m = L / L0:

    every residual branch      x + m^-a F(x)            (times the ProRes alpha)
    every block parameter      AdamW update x m^(a-1)   (matrices, biases, norm gains, gates;
                                                         decay included: torch's AdamW decays by
                                                         the group's LR)
    Adam's eps                 eps x m^-a               (every parameter: one eps in that code)
    embeddings, final norm, head: the base LR.

Pure functions of the model config (sp: every factor exactly 1).
"""
from __future__ import annotations

from andrea_jax.config import DEPTH_PARAMS, ModelConfig


def _multiplier(cfg: ModelConfig) -> float:
    return cfg.n_layer / cfg.depth_base


def exponent(cfg: ModelConfig) -> float:
    """a: 0 (sp), 1/2 (depth_mup) or 1 (completep)."""
    if cfg.depth_param not in DEPTH_PARAMS:
        raise ValueError(f"unknown model.depth_param {cfg.depth_param!r}; known: {', '.join(DEPTH_PARAMS)}")
    return DEPTH_PARAMS[cfg.depth_param]


def branch_multiplier(cfg: ModelConfig) -> float:
    """(L / L0)^-a: what every residual branch is multiplied by."""
    return 1.0 if cfg.depth_param == "sp" else _multiplier(cfg) ** -exponent(cfg)


def hidden_lr_scale(cfg: ModelConfig) -> float:
    """(L / L0)^(a - 1): what every block parameter's AdamW update is multiplied by."""
    return 1.0 if cfg.depth_param == "sp" else _multiplier(cfg) ** (exponent(cfg) - 1.0)


def eps_scale(cfg: ModelConfig) -> float:
    """(L / L0)^-a: what Adam's eps is multiplied by, for every parameter."""
    return branch_multiplier(cfg)
