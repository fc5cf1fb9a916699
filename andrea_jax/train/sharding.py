"""The shardings of the train state and the batch: the parameters laid out by the model's logical
axis names under the config's rules, the optimizer state like its parameters, the batch's rows.

The model names the dimensions of its parameters and activations (andrea_jax.names.LOGICAL_AXES);
`RULES` (andrea_jax.names) says which mesh axes split each name, and `mesh.rules` in the config
overrides it. The mesh itself, the rules for a mesh and the checks that refuse one before anything
compiles are in andrea_jax.mesh, below train and serve.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from andrea_jax import model as model_lib
from andrea_jax.config import Config
from andrea_jax.mesh import entry_axes, rules
from andrea_jax.mesh import check, make_mesh, mesh_shape  # noqa: F401  (callers find them here too)
from andrea_jax.names import MESH_AXES, RULES  # noqa: F401  (callers find them here too)


def _fit(spec: P, shape, mesh) -> P:
    """spec with the axes dropped from any dimension they do not divide (left whole)."""
    entries = tuple(spec) + (None,) * (len(shape) - len(spec))
    fitted = [e if size % math.prod(mesh.shape[a] for a in entry_axes(e)) == 0 else None
              for e, size in zip(entries, shape)]
    return P(*fitted)


def logical_param_specs(cfg: Config):
    """The parameter tree as PartitionSpecs of logical names (from the model's boxes; no allocation)."""
    boxed = jax.eval_shape(lambda rng: model_lib.init_boxed(cfg.model, rng, cfg.kernels.impl), jax.random.key(0))
    return nn.get_partition_spec(boxed)["params"]


def param_shardings(cfg: Config, mesh: jax.sharding.Mesh):
    """NamedShardings of the parameter tree under the config's rules."""
    table = rules(cfg, mesh)
    shapes = model_lib.param_shapes(cfg.model)
    return jax.tree.map(lambda names, s: NamedSharding(mesh, _fit(nn.logical_to_mesh_axes(tuple(names), table),
                                                                  s.shape, mesh)),
                        logical_param_specs(cfg), shapes, is_leaf=lambda x: isinstance(x, P))


def state_shardings(abstract_state, tx: optax.GradientTransformation, cfg: Config, mesh: jax.sharding.Mesh):
    """Shardings of a TrainState like `abstract_state`: the params by the rules, every copy of the
    params inside the optimizer state (Adam's moments) alike, all else (step, counts) replicated."""
    params = param_shardings(cfg, mesh)
    replicated = NamedSharding(mesh, P())
    # optax.partition (optim.name=muon) keeps each group's copy of the params with the other
    # group's leaves as MaskedNode, which stay as they are.
    masked = lambda x: isinstance(x, optax.MaskedNode)
    opt = optax.tree_map_params(tx, lambda v, s: v if masked(v) else s, abstract_state.opt_state, params,
                                transform_non_params=lambda _: replicated, is_leaf=masked)
    return abstract_state.replace(step=replicated, params=params, opt_state=opt)


def batch_spec(cfg: Config, mesh: jax.sharding.Mesh) -> P:
    """The spec of a [batch, ...] array of tokens: rows split as the logical `batch`."""
    return P(dict(rules(cfg, mesh))["batch"])


def batch_devices(cfg: Config, mesh: jax.sharding.Mesh) -> int:
    """How many devices split the batch: global batches must be a multiple of it."""
    return math.prod(mesh.shape[a] for a in entry_axes(dict(rules(cfg, mesh))["batch"]))


def bytes_per_device(tree) -> int:
    """Bytes that one device holds of a tree of arrays (or ShapeDtypeStructs with shardings)."""
    total = 0
    for a in jax.tree.leaves(tree):
        shard = a.sharding.shard_shape(a.shape)
        total += math.prod(shard) * a.dtype.itemsize
    return total
