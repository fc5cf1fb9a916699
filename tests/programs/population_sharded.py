"""A population of 8 members (mixed seeds, LRs, warmups, weight decays, ProRes T and scale_updates)
trained K steps on 8 CPU devices, under a mesh that splits the rows (data) and one that splits the
parameters and Adam's moments (fsdp), against the same population on one device: the largest
|difference| over every member's parameters and over the losses. Prints one line per mesh, then ALL OK.

Run by tests/test_population.py in a subprocess (the rest of the suite sees one device):
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/programs/population_sharded.py PARAMS_TOL LOSS_TOL
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

from andrea_jax.config import Config, MeshConfig, ModelConfig, OptimConfig, ProResConfig, TrainConfig  # noqa: E402
from andrea_jax.train import population, steps  # noqa: E402

K = 6
BASE = Config(model=ModelConfig(vocab_size=300, seq_len=16, d_model=32, n_layer=2, n_head=4),
              prores=ProResConfig(schedule="linear", warmup=3),
              optim=OptimConfig(lr=1e-2, warmup_steps=2, weight_decay=0.1),
              train=TrainConfig(steps=K, batch_size=8, data_seed=0))
MEMBERS = [[f"train.seed={i % 3}", f"optim.lr={3e-3 * (i + 1):g}", f"optim.warmup_steps={i % 4}",
            f"optim.weight_decay={0.05 * i:g}", f"prores.warmup={i % 4}",
            f"prores.scale_updates={('none', 'alpha', 'sqrt_alpha')[i % 3]}", f"prores.forward={i != 5}"]
           for i in range(8)]
MESHES = [(8, 1, 1), (1, 8, 1)]


def run(mesh_shape, devices, batches):
    base = dataclasses.replace(BASE, mesh=MeshConfig(*mesh_shape))
    cfgs = population.member_configs(base, MEMBERS)
    mesh = steps.make_mesh(cfgs[0], devices)
    state, step, losses = population.create_states(cfgs, mesh), population.make_train_step(cfgs, mesh), []
    for tokens in batches:
        state, metrics = step(state, tokens)
        losses.append(metrics["loss"])
    return jax.device_get(state.params), np.asarray(jax.device_get(losses))


def max_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def main(params_tol: float, loss_tol: float) -> None:
    batches = np.random.default_rng(0).integers(0, 300, (K, 8, 17)).astype(np.int32)
    want_params, want_losses = run((1, 1, 1), jax.devices()[:1], batches)
    assert np.all(np.isfinite(want_losses)) and len(jax.devices()) == 8
    for shape in MESHES:
        params, losses = run(shape, jax.devices(), batches)
        diff, loss_diff = max_diff(params, want_params), max_diff(losses, want_losses)
        print(f"mesh {shape}: 8 members on 8 devices against one device: max |params difference| {diff:.2e}, "
              f"max |loss difference| {loss_diff:.2e}", flush=True)
        assert diff <= params_tol and loss_diff <= loss_tol, (shape, diff, loss_diff)
    print("ALL OK")


if __name__ == "__main__":
    main(float(sys.argv[1]), float(sys.argv[2]))
