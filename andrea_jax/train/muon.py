"""optim.name=muon: Muon (optax.contrib.muon) for the blocks' hidden matrices, AdamW for the rest.

The scanned model stacks each block matrix as one [L, in, out] parameter. Newton-Schulz must
orthogonalize each layer's [in, out] matrix, never the stacked tensor, so every stacked kernel gets
MuonDimensionNumbers(reduction_axis=1, output_axis=2): optax treats the remaining axis (the layer)
as a batch axis and orthogonalizes each slice on its own (a vmap), with Keller Jordan's width
factor sqrt(max(1, out / in)) per slice. The fused attention kernel [d_model, 3 x d_model] is one
matrix per layer: Q, K and V are orthogonalized together.

Embeddings, positions, norms, biases, the residual gates and llama's head (every parameter outside
`blocks`, and every block parameter that is not a kernel) take the run's AdamW, with its decay
mask, at optim.lr; the matrices take optim.muon_lr on the same schedule. Gradient clipping, the
finiteness guard and prores.scale_updates wrap the pair as they wrap AdamW alone."""
from __future__ import annotations

import jax
import optax
from optax.contrib import MuonDimensionNumbers

# The [in, out] axes of a stacked [L, in, out] block kernel; the layer axis is a batch axis.
STACKED_MATRIX = MuonDimensionNumbers(reduction_axis=1, output_axis=2)


def _is_hidden_matrix(path, leaf) -> bool:
    names = tuple(str(getattr(k, "key", k)) for k in path)
    return names[0] == "blocks" and names[-1].endswith("kernel") and leaf.ndim == 3


def labels(params):
    """"muon" for each stacked block kernel, "adamw" for every other parameter."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: "muon" if _is_hidden_matrix(path, leaf) else "adamw", params)


def dimension_numbers(params):
    """STACKED_MATRIX for each stacked block kernel, None (not Muon's) for the rest."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: STACKED_MATRIX if _is_hidden_matrix(path, leaf) else None, params)


def muon_and_adamw(muon_lr: optax.Schedule, momentum: float, weight_decay: float,
                   adamw: optax.GradientTransformation) -> optax.GradientTransformation:
    """optax's Muon (Nesterov, 5 Newton-Schulz steps, its default coefficients) on the labels'
    "muon" leaves with `muon_lr` and decoupled `weight_decay` (times the LR, as optax's adamw
    decays), `adamw` on the "adamw" leaves."""
    muon = optax.contrib.muon(muon_lr, beta=momentum, weight_decay=weight_decay,
                              muon_weight_dimension_numbers=dimension_numbers)
    return optax.partition({"muon": muon, "adamw": adamw}, labels)
