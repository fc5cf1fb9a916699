"""The device mesh, below model, train and serve: its shape from the config, the config's logical
axis rules for a mesh, and the checks that refuse a mesh before anything compiles. The names it
lays out (mesh axes, logical axes, the default RULES) are in andrea_jax.names; the shardings of the
train state and the batch in andrea_jax.train.sharding.

The mesh has three axes, all of type Auto (flax's unboxing breaks on Explicit axes):
- `data`:   plain data parallelism: the batch is split, the state replicated;
- `fsdp`:   fully sharded data parallelism (ZeRO-3): the batch is split, and every matrix (and its
            Adam moments) is split along its d_model dimension; XLA gathers a layer's weights
            for its matmuls and reduce-scatters its gradients;
- `tensor`: tensor (Megatron) parallelism: attention heads, the MLP's hidden width and the
            vocabulary are split; activations are gathered only inside attention and MLP
            (one all-reduce after each output projection).
"""
from __future__ import annotations

import math

import jax
from jax.sharding import AxisType

from andrea_jax.config import Config, MeshConfig
from andrea_jax.config_text import parse_ramp, parse_rules
from andrea_jax.errors import ConfigError
from andrea_jax.names import MESH_AXES, RULES, WHOLE_IF_NOT_DIVISIBLE


def entry_axes(entry) -> tuple[str, ...]:
    """The mesh axes of a rule's entry (None, one axis or several) as a tuple."""
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
        axes = tuple(a for a in entry_axes(entry) if mesh.shape.get(a, 1) > 1)
        if name in WHOLE_IF_NOT_DIVISIBLE and sizes[name][0] % math.prod(mesh.shape[a] for a in axes):
            axes = ()
        out.append((name, axes[0] if len(axes) == 1 else axes or None))
    return tuple(out)


def check(cfg: Config, mesh: jax.sharding.Mesh) -> None:
    """Refuses, naming the mesh setting, a mesh whose axes do not divide what they split."""
    sizes = _sizes(cfg)
    for name, entry in rules(cfg, mesh):
        axes = entry_axes(entry)
        n = math.prod(mesh.shape[a] for a in axes)
        if n > 1 and sizes[name][0] % n:
            settings = " x ".join(f"mesh.{a}={mesh.shape[a]}" for a in axes)
            raise ConfigError(f"{settings}: {sizes[name][1]} is not divisible by the {n} devices that "
                              f"split the logical axis {name!r}")
    _check_batch_ramp(cfg, mesh)


def _check_batch_ramp(cfg: Config, mesh: jax.sharding.Mesh) -> None:
    """Refuses a train.batch_ramp stage whose microbatch the devices that split the batch cannot split."""
    axes = entry_axes(dict(rules(cfg, mesh))["batch"])
    n, micro = math.prod(mesh.shape[a] for a in axes), cfg.train.microbatches
    for batch, _ in parse_ramp("train.batch_ramp", cfg.train.batch_ramp):
        if batch // micro % n:
            raise ConfigError(f"train.batch_ramp: stage batch {batch} / train.microbatches={micro} is not "
                              f"divisible by the {n} devices that split the batch "
                              f"({' x '.join(f'mesh.{a}={mesh.shape[a]}' for a in axes)})")


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
