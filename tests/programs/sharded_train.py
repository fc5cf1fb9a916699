"""The train step on 8 CPU devices, under every kind of mesh, equals the same step on one device.

Run by tests/test_sharding.py in a subprocess (the rest of the suite sees one device):
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/programs/sharded_train.py equal|hlo
- equal: meshes (data, fsdp, tensor) = (8,1,1), (1,8,1), (2,2,2), (1,2,4) give the losses and
  parameters of one device; the params and Adam moments are sharded as the rules say; under
  fsdp=8 a device holds 1/8 of the state (plus the replicated vectors); 1, 2 and 4 microbatches
  agree, sharded or not.
- muon: optim.name=muon on meshes (1,8,1) and (2,2,2) gives the losses and parameters of one
  device, with Muon's momentum sharded like its matrix (Newton-Schulz on split matrices).
- hlo: with the Pallas kernels (per row shard) the compiled step has exactly the collectives of
  XLA's own path, neither moves activations between layouts (no all-gather, all-to-all or
  collective-permute of an activation), and both compute the same step.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import pathlib
import re
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from andrea_jax.train import sharding, steps  # noqa: E402
from andrea_jax.config import (Config, KernelsConfig, MeshConfig, ModelConfig, OptimConfig,  # noqa: E402
                               ProResConfig, TrainConfig)

# ProRes ramps over the 4 steps and scales the blocks' updates by alpha (prores.scale_updates):
# every mesh and microbatch count below must give that update, too. 40 rows of 24 positions: sizes
# that no parameter has, so hlo() recognises an activation by its leading dimensions (all 40 rows,
# or a device's share) followed by 24. Every section steps these shapes, so the steps hlo() compiles
# for XLA's own path are those equal() compiled, read back from the compilation cache.
CFG = Config(model=ModelConfig(vocab_size=300, seq_len=24, d_model=32, n_layer=3, n_head=4),
             prores=ProResConfig(schedule="linear", warmup=1, scale_updates="alpha"),
             # eps 1e-4, not 1e-8: Adam would blow the rounding noise of the (mathematically zero)
             # gradients of the key projection's bias-like directions up to full +-lr updates.
             optim=OptimConfig(lr=1e-2, warmup_steps=0, eps=1e-4), train=TrainConfig(steps=4, batch_size=40))
TOKENS_SHAPE = (CFG.train.batch_size, CFG.model.seq_len + 1)
MESHES = [(8, 1, 1), (1, 8, 1), (2, 2, 2), (1, 2, 4)]


def configure(cfg: Config, mesh=(-1, 1, 1), impl="xla", microbatches=1) -> Config:
    return dataclasses.replace(cfg, mesh=MeshConfig(*mesh), kernels=KernelsConfig(impl),
                               train=dataclasses.replace(cfg.train, microbatches=microbatches))


def run(cfg: Config, mesh, batches):
    state = steps.create_state(cfg, jax.random.key(0), mesh)
    # The step donates the state it is given: keep the created one's layout and values aside.
    first = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state)
    first = first.replace(params=jax.device_get(state.params)) if mesh.size == 1 else first
    step = steps.make_train_step(cfg, mesh)
    losses = []
    for batch in batches:
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return losses, state, step, first


def keyed(tree) -> dict:
    return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def assert_same(losses, params, ref_losses, ref_params, what):
    # Same math, per-device partial sums + all-reduces instead of one sum: float32 rounding only
    # (measured over 3 steps: losses <= 4.2e-7 relative, parameters <= 1.8e-7 absolute).
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-6, err_msg=what)
    # Adam divides each gradient element by its own RMS, so a rounding difference in a small
    # element moves that element's update by a fraction of lr; a real sharding bug moves updates
    # by O(lr) = 1e-2.
    ref, got = keyed(ref_params), keyed(jax.device_get(params))
    for key, a in got.items():
        # measured <= 1.8e-7 against a bound of 1e-5 (1e-3 lr): far below an O(lr) sharding bug
        np.testing.assert_allclose(a, ref[key], rtol=0, atol=1e-3 * CFG.optim.lr, err_msg=f"{what} {key}")
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    param_err = max(float(np.max(np.abs(a - ref[k]))) for k, a in got.items())
    print(f"{what}: losses within {loss_err:.2g} relative, parameters within {param_err:.2g}", flush=True)


# The layout the rules give each parameter (the scan's layer axis first, never split).
EXPECTED = {
    (8, 1, 1): {},  # plain data parallelism: everything replicated
    (1, 8, 1): {"['blocks']['attn_qkv_kernel']": P(None, "fsdp", None),
                "['blocks']['attn_out_kernel']": P(None, None, "fsdp"),
                "['blocks']['mlp_fc_kernel']": P(None, "fsdp", None),
                "['blocks']['mlp_proj_kernel']": P(None, None, "fsdp"),
                "['tok_embedding']": P(None, "fsdp"), "['pos_embedding']": P(None, "fsdp")},
    (2, 2, 2): {"['blocks']['attn_qkv_kernel']": P(None, "fsdp", None),
                "['blocks']['attn_out_kernel']": P(None, "tensor", "fsdp"),
                "['blocks']['mlp_fc_kernel']": P(None, "fsdp", "tensor"),
                "['blocks']['mlp_fc_bias']": P(None, "tensor"),
                "['blocks']['mlp_proj_kernel']": P(None, "tensor", "fsdp"),
                "['tok_embedding']": P("tensor", "fsdp"), "['pos_embedding']": P(None, "fsdp")},
}
EXPECTED[(1, 2, 4)] = EXPECTED[(2, 2, 2)]


def check_specs(state, mesh, shape):
    """Params as EXPECTED (all else replicated); every Adam moment sharded like its parameter."""
    params = keyed(state.params)
    for key, a in params.items():
        want = NamedSharding(mesh, EXPECTED[shape].get(key, P()))
        assert a.sharding.is_equivalent_to(want, a.ndim), f"{shape} {key}: {a.sharding.spec}, want {want.spec}"
    n_moments = 0
    for key, a in keyed(state.opt_state).items():
        owner = [k for k in params if key.endswith(k)]
        want = params[owner[0]].sharding if owner else NamedSharding(mesh, P())
        assert a.sharding.is_equivalent_to(want, a.ndim), f"{shape} opt_state{key}: {a.sharding.spec}"
        n_moments += bool(owner)
    assert n_moments == 2 * len(params), f"expected mu and nu for each parameter, found {n_moments}"
    assert state.step.sharding.is_fully_replicated


def check_fsdp_memory(state, step, batch):
    """fsdp=8: a device holds 1/8 of every split array plus the whole of the replicated ones."""
    leaves = jax.tree.leaves(state)
    total = sum(a.nbytes for a in leaves)
    replicated = sum(a.nbytes for a in leaves if a.sharding.is_fully_replicated)
    bound = (total - replicated) / 8 + replicated
    held = sharding.bytes_per_device(state)
    compiled = step.lower(state, batch).compile().memory_analysis()
    args = compiled.argument_size_in_bytes - batch.nbytes // 8  # the state, without this device's rows
    print(f"fsdp=8: state {total} B in all, {replicated} B replicated; per device {held} B held, "
          f"{args} B as compiled arguments, bound {bound:.0f} B")
    assert held <= bound and args <= bound, (held, args, bound)
    assert replicated < total / 20, "most of the state should be split"


def equal():
    batches = [np.asarray(jax.random.randint(jax.random.key(i), TOKENS_SHAPE, 0, 300), np.int32) for i in range(3)]
    one_cfg = configure(CFG, (1, 1, 1))
    one = steps.make_mesh(one_cfg, jax.devices()[:1])
    ref_losses, ref_state, _, ref_first = run(one_cfg, one, batches)
    ref_params = jax.device_get(ref_state.params)
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(ref_params),
                                                             jax.tree.leaves(ref_first.params)))
    assert moved > 100 * 1e-3 * CFG.optim.lr, f"the updates ({moved}) are too small to tell a bug from rounding"
    for shape in MESHES:
        cfg = configure(CFG, shape)
        mesh = steps.make_mesh(cfg)
        assert dict(mesh.shape) == dict(zip(sharding.MESH_AXES, shape))
        losses, state, step, first = run(cfg, mesh, batches)
        check_specs(first, mesh, shape)   # created in place ...
        check_specs(state, mesh, shape)   # ... and kept there by the step
        assert_same(losses, state.params, ref_losses, ref_params, f"mesh {shape}")
        if shape == (1, 8, 1):
            check_fsdp_memory(state, step, jax.device_put(batches[0], steps.batch_sharding(cfg, mesh)))
        print(f"OK mesh {shape} == one device", losses, flush=True)

    # Gradient accumulation: the same update from 2 or 4 slices of the batch.
    losses, state, _, _ = run(configure(CFG, (1, 1, 1), microbatches=4), one, batches)
    assert_same(losses, state.params, ref_losses, ref_params, "4 microbatches")
    print("OK 4 microbatches == 1", losses, flush=True)
    cfg = configure(CFG, (2, 2, 2), microbatches=2)  # 20 rows per slice over the 4 data x fsdp devices
    losses, state, _, _ = run(cfg, steps.make_mesh(cfg), batches)
    check_specs(state, steps.make_mesh(cfg), (2, 2, 2))
    assert_same(losses, state.params, ref_losses, ref_params, "2 microbatches on (2, 2, 2)")
    print("OK 2 microbatches on (2, 2, 2) == 1 on one device", flush=True)
    print("ALL OK equal", flush=True)


COLLECTIVE = re.compile(r"= (.*?) (all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)(?:-start)?\(")
MOVES = ("all-gather", "all-to-all", "collective-permute", "reduce-scatter")


def collectives(hlo: str) -> collections.Counter:
    """(op, result shape) of every collective in a compiled module."""
    return collections.Counter((m.group(2), re.sub(r"\{[^}]*\}", "", m.group(1))) for m in COLLECTIVE.finditer(hlo))


def hlo():
    # An activation: all 40 rows, or a device's 5, 10 or 20, followed by the 24 positions.
    activation = re.compile(r"\[(40|5|10|20),24[,\]]")
    batch = np.asarray(jax.random.randint(jax.random.key(0), TOKENS_SHAPE, 0, 300), np.int32)
    for shape in [(1, 8, 1), (1, 2, 4)]:
        found, stepped = {}, {}
        for impl in ("xla", "pallas"):
            cfg = configure(CFG, shape, impl)
            mesh = steps.make_mesh(cfg)
            tokens = jax.ShapeDtypeStruct(TOKENS_SHAPE, np.int32, sharding=steps.batch_sharding(cfg, mesh))
            lowered = steps.make_train_step(cfg, mesh).lower(steps.abstract_state(cfg, mesh), tokens)
            if impl == "pallas":  # the kernels ran per shard, inside shard_maps
                assert lowered.as_text().count("sdy.manual_computation") >= 8, "no per-shard kernels"
            compiled = lowered.compile()
            found[impl] = collectives(compiled.as_text())
            moved = [(op, s) for (op, s) in found[impl] if op in MOVES and activation.search(s)]
            assert not moved, f"{shape} {impl}: activations moved between layouts: {moved}"
            state, metrics = compiled(steps.create_state(cfg, jax.random.key(0), mesh),
                                      jax.device_put(batch, tokens.sharding))
            stepped[impl] = (float(metrics["loss"]), jax.device_get(state.params))
        assert found["pallas"] == found["xla"], (
            f"{shape}: pallas {sorted(found['pallas'].items())} != xla {sorted(found['xla'].items())}")
        # ... and computes the same step (under tensor, bias+GELU on its share of the hidden width).
        assert_same([stepped["pallas"][0]], stepped["pallas"][1], [stepped["xla"][0]], stepped["xla"][1],
                    f"pallas vs xla on {shape}")
        by_op = dict(collections.Counter(op for op, _ in found["xla"].elements()))
        print(f"OK {shape}: pallas and xla have the same {sum(found['xla'].values())} collectives ({by_op}), "
              f"no activation moved", flush=True)
    print("ALL OK hlo", flush=True)


def muon():
    cfg0 = dataclasses.replace(CFG, optim=dataclasses.replace(CFG.optim, name="muon", muon_lr=0.02))
    batches = [np.asarray(jax.random.randint(jax.random.key(i), TOKENS_SHAPE, 0, 300), np.int32) for i in range(3)]
    one_cfg = configure(cfg0, (1, 1, 1))
    ref_losses, ref_state, _, _ = run(one_cfg, steps.make_mesh(one_cfg, jax.devices()[:1]), batches)
    ref_params = jax.device_get(ref_state.params)
    for shape in [(1, 8, 1), (2, 2, 2)]:
        cfg = configure(cfg0, shape)
        mesh = steps.make_mesh(cfg)
        losses, state, _, _ = run(cfg, mesh, batches)
        params = keyed(state.params)
        momenta = {k: a for k, a in keyed(state.opt_state).items() if "'muon'" in k and ".mu[" in k}
        assert len(momenta) == 4, sorted(momenta)
        for key, a in momenta.items():
            owner = [k for k in params if key.endswith(k)][0]
            assert a.sharding.is_equivalent_to(params[owner].sharding, a.ndim), (shape, key, a.sharding.spec)
        assert_same(losses, state.params, ref_losses, ref_params, f"muon mesh {shape}")
        print(f"OK muon mesh {shape} == one device", losses, flush=True)
    print("ALL OK muon", flush=True)


if __name__ == "__main__":
    assert jax.device_count() == 8, jax.devices()
    {"equal": equal, "hlo": hlo, "muon": muon}[sys.argv[1] if len(sys.argv) > 1 else "equal"]()
