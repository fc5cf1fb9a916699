"""Two train steps with model.loss_chunks=4 on 8 CPU devices, under meshes that split the rows (data,
fsdp) and the vocabulary (tensor), against the plain loss on one device: losses, z-losses, gradient
norms, Adam's moments and parameters. Prints the largest relative difference per mesh, then ALL OK.

Run by tests/test_chunked_loss.py in a subprocess (the rest of the suite sees one device):
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/programs/chunked_loss_sharded.py TOL
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from andrea_jax.train import steps  # noqa: E402
from andrea_jax.config import Config, MeshConfig, ModelConfig, OptimConfig, ProResConfig, TrainConfig  # noqa: E402

# eps 1e-4: Adam would blow the rounding noise of the (mathematically zero) gradients of the key
# projection's bias up to +-lr updates (as tests/programs/sharded_train.py)
CFG = Config(model=ModelConfig(vocab_size=300, seq_len=32, d_model=64, n_layer=2, n_head=4),
             prores=ProResConfig(schedule="none"), optim=OptimConfig(lr=1e-2, warmup_steps=0, eps=1e-4, z_loss=0.05),
             train=TrainConfig(steps=2, batch_size=8))
MESHES = [(8, 1, 1), (1, 8, 1), (2, 2, 2), (1, 2, 4)]


def run(cfg: Config, batches, devices, initial):
    """Two steps from the state whose leaves are `initial` (host arrays), placed as cfg's mesh shards it:
    every mesh starts from the one device's values, and no mesh compiles an initialiser of its own."""
    mesh = steps.make_mesh(cfg, devices)
    shardings = steps.state_shardings(cfg, mesh)
    state = jax.tree.unflatten(jax.tree.structure(shardings),
                               [jax.device_put(a, s) for a, s in zip(initial, jax.tree.leaves(shardings))])
    step = steps.make_train_step(cfg, mesh)
    metrics = []
    for batch in batches:
        state, m = step(state, batch)
        metrics.append({k: float(m[k]) for k in ("loss", "z_loss", "grad_norm")})
    return metrics, jax.device_get((state.params, optax.tree_utils.tree_get(state.opt_state, "mu"),
                                    optax.tree_utils.tree_get(state.opt_state, "nu")))


def max_rel(got, want) -> float:
    return max(float(np.max(np.abs(g - w)) / np.max(np.abs(w))) for g, w in zip(jax.tree.leaves(got),
                                                                                jax.tree.leaves(want)))


def main(tol: float) -> None:
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 300, (8, 33)).astype(np.int32) for _ in range(2)]
    one = dataclasses.replace(CFG, mesh=MeshConfig(1, 1, 1))
    one_mesh = steps.make_mesh(one, jax.devices()[:1])
    initial = jax.tree.leaves(jax.device_get(steps.create_state(one, jax.random.key(0), one_mesh)))
    want_metrics, want = run(one, batches, jax.devices()[:1], initial)
    for mesh in MESHES:
        cfg = dataclasses.replace(CFG, mesh=MeshConfig(*mesh), model=dataclasses.replace(CFG.model, loss_chunks=4))
        got_metrics, got = run(cfg, batches, jax.devices(), initial)
        metric_diff = max(abs(g[k] - w[k]) / abs(w[k]) for g, w in zip(got_metrics, want_metrics) for k in w)
        diff = max(metric_diff, max_rel(got, want))
        print(f"mesh {mesh} chunks 4 against one device plain: max relative difference {diff:.2e}")
        assert diff <= tol, (mesh, diff)
    print("ALL OK")


if __name__ == "__main__":
    main(float(sys.argv[1]))
