"""Per-device memory of the train step under each kind of mesh and remat, as XLA:GPU compiles it.

    python benchmarks/memory.py                                   # the docs/SCALING.md table (H200)
    python benchmarks/memory.py --configs tiny --devices 1,8 --batch 16 --remat none
    python benchmarks/memory.py --target cpu                      # XLA:CPU on fake CPU devices instead

Nothing is allocated and no GPU is needed: the step is lowered with abstract inputs
(ShapeDtypeStructs carrying their shardings) and compiled by `andrea_jax.aot` for N GPUs of the
target (the CUDA plugin's deviceless XLA:GPU pipeline; the gpu-compile extra), and XLA's memory
analysis of the compiled step is read. Parameters and optimizer state are the shards each device
holds (exact); `temp` is XLA's scratch of the compiled step: the activations kept for the backward
pass, the gradients and the workspace of its own kernels; `peak` is arguments + outputs - donated
+ temp. None of it counts cuBLAS / cuDNN workspace or the CUDA context (a few hundred MiB).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

LAYOUTS = {  # name -> mesh (data, fsdp, tensor) for n devices
    "data": lambda n, t: (n, 1, 1),
    "fsdp": lambda n, t: (1, n, 1),
    "fsdp+tensor": lambda n, t: (1, n // t, t),
}


def measure(cfg, mesh_shape, devices, backend: str = "gpu") -> dict:
    from andrea_jax import aot, config as config_lib
    from andrea_jax.train import sharding, steps

    cfg = dataclasses.replace(cfg, mesh=config_lib.MeshConfig(*mesh_shape))
    t0 = time.perf_counter()
    (report,) = aot.compile_steps(cfg, devices, eval_step=False, count_flops=False, backend=backend)
    mesh = steps.make_mesh(cfg, devices)
    state = steps.abstract_state(cfg, mesh)
    return {"params": sharding.bytes_per_device(state.params),
            "opt": sharding.bytes_per_device(state.opt_state),
            "args": report.argument_bytes, "temp": report.temp_bytes, "peak": report.peak_bytes,
            "compile_s": time.perf_counter() - t0,
            "rows": cfg.train.batch_size // sharding.batch_devices(cfg, mesh)}


def mib(b: int) -> str:
    return f"{b / 2**20:,.0f}" if b >= 2**20 else f"{b / 2**20:.2f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="andrea_120m;depth:family=71m,layers=120",
                        help="config names separated by ';' (a depth config holds commas)")
    parser.add_argument("--target", default="h200", help="h100 | h200 | a100 (andrea_jax.aot), or cpu")
    parser.add_argument("--devices", default="1,8,64", help="device counts")
    parser.add_argument("--batch", type=int, default=64, help="global batch in sequences (all layouts)")
    parser.add_argument("--tensor", type=int, default=4, help="tensor-parallel size of fsdp+tensor")
    parser.add_argument("--remat", default="none,dots,full", help="model.remat values")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config field of every config (e.g. model.dtype=bfloat16)")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.devices.split(",")]
    if args.target == "cpu":
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={max(counts)}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from andrea_jax import startup
    from andrea_jax import aot
    with startup.native_stderr_silenced():
        import jax
        jax.devices("cpu")
    from andrea_jax import config as config_lib, configs, model as model_lib

    print(f"{args.target}: global batch {args.batch} sequences; sizes per device in MiB; "
          f"{' '.join(args.set) or 'each config as it is'}\n")
    print("| config | devices | mesh (data, fsdp, tensor) | remat | rows/device | params | optimizer | "
          "compiled arguments | temp (activations, grads) | peak | compile s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.configs.split(";"):
        base = config_lib.override(configs.load(name), args.set)
        base = dataclasses.replace(base, train=dataclasses.replace(base.train, batch_size=args.batch))
        n_params = model_lib.count_params(base.model)
        for n in counts:
            devices = jax.devices("cpu")[:n] if args.target == "cpu" else aot.gpu_devices(args.target, n)
            seen = set()
            for layout, shape_of in LAYOUTS.items():
                shape = shape_of(n, min(args.tensor, n))
                if shape in seen:
                    continue
                seen.add(shape)
                for remat in args.remat.split(","):
                    cfg = dataclasses.replace(base, model=dataclasses.replace(base.model, remat=remat))
                    m = measure(cfg, shape, devices, "cpu" if args.target == "cpu" else "gpu")
                    label = "any" if n == 1 else layout
                    print(f"| {name} ({n_params / 1e6:.1f}M) | {n} | {label} {shape} | {remat} | {m['rows']} | "
                          f"{mib(m['params'])} | {mib(m['opt'])} | {mib(m['args'])} | {mib(m['temp'])} | "
                          f"{mib(m['peak'])} | {m['compile_s']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
