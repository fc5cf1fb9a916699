"""Runs a row-wise kernel once per shard of the rows, so that no all-gather is needed.

A `pallas_call` (or `triton_call`) has no sharding rule: under jit with sharded inputs XLA would
gather the activations and run the kernel redundantly on every device. The kernels here are
row-wise, so each device can run them on its own rows; only the reductions over rows (dgamma,
dbeta, dalpha, dbias) need a `psum` across the devices that split the rows.

Which mesh axes split the rows:
- arrays typed with explicit sharding (`jax.make_mesh` default axis types): the axes that their
  type names on the leading (row) dimensions, and the mesh comes from the type itself;
- otherwise the mesh of the surrounding `jax.set_mesh` (auto axes): axes named like a batch axis
  (`BATCH_AXES`) split dim 0 and axes named like a sequence axis (`SEQ_AXES`) split dim 1.
With no mesh, a 1-device mesh, rows that the axes do not divide, or a feature dimension that is
itself sharded, the kernel runs unwrapped (correct, as XLA then gathers).

Kernels that are elementwise along the feature dimension too (bias + GELU) ask for
`row_layout(x, features=True)`: then a sharded feature dimension is kept (explicit types), or,
under auto axes, axes named like a tensor-parallel axis (`TENSOR_AXES`) split it, as the MLP's
hidden width is split in Megatron-style tensor parallelism; the [D] parameter is split alike.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import jax
from jax.sharding import AxisType, PartitionSpec as P

BATCH_AXES = ("data", "batch", "fsdp", "replica")
SEQ_AXES = ("seq", "sequence", "context")
TENSOR_AXES = ("tensor", "model")


@dataclasses.dataclass(frozen=True)
class RowLayout:
    """How the rows of an [..., D] array are split: the mesh, the spec, the axes to psum over."""
    mesh: object
    spec: P           # of the [..., D] array; the last entry is None unless features are split
    axes: tuple[str, ...]  # the row axes (what "sum" outputs are psum'd over)

    def spec_for(self, kind: str) -> P:
        feature = P(self.spec[-1])
        return {"row": self.spec, "stat": P(*self.spec[:-1]), "rep": P(), "sum": P(),
                "vec": feature, "vsum": feature}[kind]


def _axis_types(mesh) -> dict:
    return dict(zip(mesh.axis_names, mesh.axis_types))


def _names(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def _explicit_layout(x, features: bool) -> RowLayout | None:
    sharding = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty or mesh.size == 1:
        return None
    spec = tuple(sharding.spec) + (None,) * (x.ndim - len(sharding.spec))
    if _names(spec[-1]) and not features:
        return None
    types = _axis_types(mesh)
    axes = tuple(a for entry in spec[:-1] for a in _names(entry) if types[a] == AxisType.Explicit)
    if not all(types[a] == AxisType.Explicit for a in _names(spec[-1])):
        return None
    if not (axes or _names(spec[-1])) or len(axes) != sum(len(_names(e)) for e in spec[:-1]):
        return None
    return RowLayout(mesh, P(*spec), axes)


def _context_layout(x, features: bool) -> RowLayout | None:
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or x.ndim < 2:
        return None
    types = _axis_types(mesh)
    free = [a for a in mesh.axis_names if types[a] == AxisType.Auto and mesh.shape[a] > 1]
    batch = tuple(a for a in free if a in BATCH_AXES)
    seq = tuple(a for a in free if a in SEQ_AXES)
    if x.ndim == 2:  # [rows, D]: every row axis splits the single row dimension
        dims = [batch + seq]
    else:
        dims = [batch, seq] + [()] * (x.ndim - 3)
    for size, names in zip(x.shape, dims):
        if size % math.prod(mesh.shape[a] for a in names):
            return None
    axes = tuple(a for names in dims for a in names)
    tensor = tuple(a for a in free if a in TENSOR_AXES) if features else ()
    if tensor and x.shape[-1] % math.prod(mesh.shape[a] for a in tensor):
        tensor = ()
    if not axes and not tensor:
        return None
    entry = lambda names: (names if len(names) > 1 else names[0]) if names else None
    spec = P(*[entry(names) for names in dims], entry(tensor))
    return RowLayout(mesh, spec, axes)


def row_layout(x, *, features: bool = False) -> RowLayout | None:
    """The split of `x` [..., D] at trace time, or None when the kernel can run as is. Rows only,
    unless `features` (an op that is elementwise along D too): then D may be split as well."""
    return _explicit_layout(x, features) or _context_layout(x, features)


def call(fn: Callable, layout: RowLayout | None, args: Sequence, in_kinds: Sequence[str],
         out_kinds: Sequence[str]):
    """fn(*local_args) -> tuple of local outputs, run per shard.

    kinds: "row" ([..., D] split like the layout), "stat" ([...], the same without D), "rep"
    (replicated), "sum" (an output that is a sum over local rows: psum'd over the row axes),
    "vec" ([D], split like the layout's D) and "vsum" (a [D] sum over local rows, split like D).
    """
    if layout is None:
        return fn(*args)

    def per_shard(*local):
        outs = fn(*local)
        return tuple(jax.lax.psum(o, layout.axes) if k in ("sum", "vsum") and layout.axes else o
                     for o, k in zip(outs, out_kinds))

    # check_vma=False: pallas_call / triton_call carry no varying-axes rule; the psum above makes
    # the "sum" outputs replicated, which is what their out_spec P() claims.
    return jax.shard_map(per_shard, mesh=layout.mesh,
                         in_specs=tuple(layout.spec_for(k) for k in in_kinds),
                         out_specs=tuple(layout.spec_for(k) for k in out_kinds),
                         check_vma=False)(*args)
