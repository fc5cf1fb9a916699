"""Per-device memory of the train step under each kind of mesh, from the compiled step alone.

    python benchmarks/memory.py                                   # the docs/SCALING.md table
    python benchmarks/memory.py --configs tiny --devices 1,8 --batch 16

Nothing is allocated: the step is lowered with abstract inputs (ShapeDtypeStructs carrying their
shardings) and compiled for fake CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count,
set here before jax starts), and XLA's memory analysis of the compiled step is read. Parameters
and optimizer state are the shards each device holds (exact); `temp` is XLA's scratch of the
compiled step: the activations kept for the backward pass, the gradients and the workspace. The
CPU compiler fuses and schedules differently from the GPU's, so take `temp` as an estimate.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

LAYOUTS = {  # name -> mesh (data, fsdp, tensor) for n devices
    "data": lambda n, t: (n, 1, 1),
    "fsdp": lambda n, t: (1, n, 1),
    "fsdp+tensor": lambda n, t: (1, n // t, t),
}


def measure(cfg, mesh_shape, n: int) -> dict:
    import jax
    import numpy as np

    from andrea_jax import config as config_lib
    from andrea_jax.train import sharding, steps

    cfg = dataclasses.replace(cfg, mesh=config_lib.MeshConfig(*mesh_shape))
    mesh = steps.make_mesh(cfg, jax.devices()[:n])
    state = steps.abstract_state(cfg, mesh)
    tokens = jax.ShapeDtypeStruct((cfg.train.batch_size, cfg.model.seq_len + 1), np.int32,
                                  sharding=steps.batch_sharding(cfg, mesh))
    analysis = steps.make_train_step(cfg, mesh).lower(state, tokens).compile().memory_analysis()
    return {"params": sharding.bytes_per_device(state.params),
            "opt": sharding.bytes_per_device(state.opt_state),
            "args": analysis.argument_size_in_bytes,
            "temp": analysis.temp_size_in_bytes,
            "rows": cfg.train.batch_size // sharding.batch_devices(cfg, mesh)}


def mib(b: int) -> str:
    return f"{b / 2**20:,.0f}" if b >= 2**20 else f"{b / 2**20:.2f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="andrea_120m;depth:family=71m,layers=120",
                        help="config names separated by ';' (a depth config holds commas)")
    parser.add_argument("--devices", default="1,8,64", help="device counts (the largest is faked)")
    parser.add_argument("--batch", type=int, default=64, help="global batch in sequences (all layouts)")
    parser.add_argument("--tensor", type=int, default=4, help="tensor-parallel size of fsdp+tensor")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.devices.split(",")]
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={max(counts)}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from andrea_jax import config as config_lib, model as model_lib

    print(f"global batch {args.batch} sequences; sizes per device in MiB\n")
    print("| config | devices | mesh (data, fsdp, tensor) | rows/device | params | optimizer | "
          "compiled arguments | temp (activations, grads) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.configs.split(";"):
        cfg = config_lib.load(name)
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=args.batch))
        n_params = model_lib.count_params(cfg.model)
        for n in counts:
            seen = set()
            for layout, shape_of in LAYOUTS.items():
                shape = shape_of(n, min(args.tensor, n))
                if shape in seen:
                    continue
                seen.add(shape)
                m = measure(cfg, shape, n)
                label = "any" if n == 1 else layout
                print(f"| {name} ({n_params / 1e6:.1f}M) | {n} | {label} {shape} | {m['rows']} | {mib(m['params'])} | "
                      f"{mib(m['opt'])} | {mib(m['args'])} | {mib(m['temp'])} |", flush=True)


if __name__ == "__main__":
    main()
