"""Every partitioning decision: the mesh, the one table of logical axis rules, the shardings of
the train state and the batch, and the checks that refuse a mesh before anything compiles.

The mesh has three axes, all of type Auto (flax's unboxing breaks on Explicit axes):
- `data`:   plain data parallelism: the batch is split, the state replicated;
- `fsdp`:   fully sharded data parallelism (ZeRO-3): the batch is split, and every matrix (and its
            Adam moments) is split along its d_model dimension; XLA gathers a layer's weights
            for its matmuls and reduce-scatters its gradients;
- `tensor`: tensor (Megatron) parallelism: attention heads, the MLP's hidden width and the
            vocabulary are split; activations are gathered only inside attention and MLP
            (one all-reduce after each output projection).
The model names the dimensions of its parameters and activations (andrea_jax.model's logical
axes); `RULES` says which mesh axes split each name, and `mesh.rules` in the config overrides it.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import optax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from andrea_jax import model as model_lib
from andrea_jax.config import MESH_AXES, Config, ConfigError, MeshConfig, parse_rules  # noqa: F401

# logical name -> the mesh axes that split it (None: whole on every device). Order matters only
# where one array has two names that want the same mesh axis: the earlier rule wins.
RULES: tuple[tuple[str, tuple[str, ...] | str | None], ...] = (
    ("batch", ("data", "fsdp")),  # activations' rows: every data-parallel device takes its own
    ("seq", None),                # positions: no sequence parallelism
    ("act_embed", None),          # the residual stream's width: whole, LayerNorm reduces over it
    ("embed", "fsdp"),            # a matrix's d_model dimension: FSDP shards the state along it
    ("heads", "tensor"),          # attention heads (the rows of the output projection)
    # The fused [q|k|v] columns stay whole on each tensor shard: split contiguously they would
    # not line up with the heads (a shard would hold all of q and part of k), so every shard
    # slices its own heads out of them, which costs no communication. FSDP still shards them.
    ("qkv", None),
    ("mlp", "tensor"),            # the MLP's hidden width
    ("vocab", "tensor"),          # the tied embedding's rows and the logits (whole when not divisible)
    ("layers", None),             # the scanned layer axis: each device holds every layer's slice
)
# Logical names whose size a mesh may fail to divide without being refused: the dimension is then
# left whole. The vocabulary (8449 = 7 x 17 x 71) cannot be padded without changing checkpoints.
WHOLE_IF_NOT_DIVISIBLE = ("vocab",)


def _axes(entry) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def mesh_shape(m: MeshConfig, n_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) with the -1 entry resolved; refuses a mesh that misses n_devices."""
    sizes = {"data": m.data, "fsdp": m.fsdp, "tensor": m.tensor}
    rest = [k for k, v in sizes.items() if v == -1]
    known = math.prod(v for v in sizes.values() if v != -1)
    if rest:
        if n_devices % known:
            raise ConfigError(f"mesh.{rest[0]}=-1: the {n_devices} devices are not divisible by the "
                              f"other mesh axes ({known})")
        sizes[rest[0]] = n_devices // known
    elif known != n_devices:
        name = next((k for k, v in sizes.items() if v > 1), "data")
        raise ConfigError(f"mesh.{name}: the mesh {sizes['data']}x{sizes['fsdp']}x{sizes['tensor']} "
                          f"(data x fsdp x tensor) has {known} devices, not the {n_devices} there are")
    return sizes["data"], sizes["fsdp"], sizes["tensor"]


def _sizes(cfg: Config) -> dict[str, tuple[int, str]]:
    """Each logical name's size and the setting it comes from (the batch per microbatch)."""
    m, t = cfg.model, cfg.train
    micro = t.microbatches
    return {"batch": (t.batch_size // micro, f"train.batch_size={t.batch_size} / train.microbatches={micro}"),
            "seq": (m.seq_len, f"model.seq_len={m.seq_len}"),
            "act_embed": (m.d_model, f"model.d_model={m.d_model}"),
            "embed": (m.d_model, f"model.d_model={m.d_model}"),
            "heads": (m.n_head, f"model.n_head={m.n_head}"),
            "qkv": (3 * m.d_model, f"3 x model.d_model={m.d_model}"),
            "mlp": (m.mlp_ratio * m.d_model,
                    f"the MLP width model.mlp_ratio x model.d_model={m.mlp_ratio * m.d_model}"),
            "vocab": (m.vocab_size, f"model.vocab_size={m.vocab_size}"),
            "layers": (m.n_layer, f"model.n_layer={m.n_layer}")}


def rules(cfg: Config, mesh: jax.sharding.Mesh) -> tuple:
    """RULES with the config's overrides, for this mesh: axes the mesh lacks or has only one device
    on are dropped (a 1-D 'data' mesh gives plain data parallelism; specs name only real splits),
    and so are the axes of a WHOLE_IF_NOT_DIVISIBLE name they do not divide."""
    table = dict(RULES) | parse_rules(cfg.mesh.rules)
    sizes = _sizes(cfg)
    out = []
    for name, entry in table.items():
        axes = tuple(a for a in _axes(entry) if mesh.shape.get(a, 1) > 1)
        if name in WHOLE_IF_NOT_DIVISIBLE and sizes[name][0] % math.prod(mesh.shape[a] for a in axes):
            axes = ()
        out.append((name, axes[0] if len(axes) == 1 else axes or None))
    return tuple(out)


def check(cfg: Config, mesh: jax.sharding.Mesh) -> None:
    """Refuses, naming the mesh setting, a mesh whose axes do not divide what they split."""
    sizes = _sizes(cfg)
    for name, entry in rules(cfg, mesh):
        axes = _axes(entry)
        n = math.prod(mesh.shape[a] for a in axes)
        if n > 1 and sizes[name][0] % n:
            settings = " x ".join(f"mesh.{a}={mesh.shape[a]}" for a in axes)
            raise ConfigError(f"{settings}: {sizes[name][1]} is not divisible by the {n} devices that "
                              f"split the logical axis {name!r}")


def make_mesh(cfg: Config | None = None, devices=None) -> jax.sharding.Mesh:
    """The (data, fsdp, tensor) mesh of cfg.mesh over `devices` (default: all), checked against
    the config. With no config: every device on `data` (plain data parallelism)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(cfg.mesh if cfg else MeshConfig(), len(devices))
    # Auto axes: jit places arrays by the shardings given; flax unboxing breaks on Explicit ones.
    mesh = jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)
    if cfg is not None:
        check(cfg, mesh)
    return mesh


def _fit(spec: P, shape, mesh) -> P:
    """spec with the axes dropped from any dimension they do not divide (left whole)."""
    entries = tuple(spec) + (None,) * (len(shape) - len(spec))
    fitted = [e if size % math.prod(mesh.shape[a] for a in _axes(e)) == 0 else None
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
    return math.prod(mesh.shape[a] for a in _axes(dict(rules(cfg, mesh))["batch"]))


def bytes_per_device(tree) -> int:
    """Bytes that one device holds of a tree of arrays (or ShapeDtypeStructs with shardings)."""
    total = 0
    for a in jax.tree.leaves(tree):
        shard = a.sharding.shard_shape(a.shape)
        total += math.prod(shard) * a.dtype.itemsize
    return total
