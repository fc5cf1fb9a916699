"""Registers and occupancy of the Pallas kernels as ptxas builds them for a GPU, on a machine without one.

    python benchmarks/kernel_registers.py                       # H200, the shipped tiling
    python benchmarks/kernel_registers.py --sweep               # also other backward tilings
    python benchmarks/kernel_registers.py --target a100 --rows 8192

Each kernel (LayerNorm, residual LayerNorm with and without dalpha, bias+GELU; forward and backward)
is compiled by XLA:GPU for the target through the CUDA plugin (andrea_jax.aot; the gpu-compile
extra), at the train step's shapes: a float32 stream of `--rows` x 768 normalised to bf16, GELU on
bf16 [rows, 3072]. XLA dumps the module's PTX; ptxas (the nvcc wheel's, the one XLA uses) assembles
it with -v for sm_XX(a), and its "Used N registers" per kernel is read. Occupancy is what the
registers allow: 65536 registers an SM, allocated per warp in units of 256, at most 64 warps and 32
CTAs an SM (Hopper and Ampere alike); shared memory, which these kernels barely use, is ignored.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import pathlib
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

REGS_PER_SM, WARPS_PER_SM, CTAS_PER_SM, ALLOC_UNIT = 65536, 64, 32, 256


def ctas_per_sm(registers: int, warps: int) -> int:
    per_warp = -(-registers * 32 // ALLOC_UNIT) * ALLOC_UNIT
    return min(REGS_PER_SM // (per_warp * warps), WARPS_PER_SM // warps, CTAS_PER_SM)


def ptxas() -> str:
    import nvidia.cuda_nvcc
    return str(pathlib.Path(list(nvidia.cuda_nvcc.__path__)[0]) / "bin" / "ptxas")


def registers(dump_dir: str, arch: str) -> dict[str, int]:
    """'case: kernel' -> registers, from ptxas -v on every PTX file of the dump (the Pallas kernels
    only: XLA's own fusions in the same modules are left out)."""
    found = {}
    for ptx in sorted(glob.glob(os.path.join(dump_dir, "*.ptx"))):
        case = re.search(r"jit_case_(\w+?)\.", os.path.basename(ptx))
        info = subprocess.run([ptxas(), "-v", f"-arch={arch}", ptx, "-o", os.devnull],
                              capture_output=True, text=True).stderr  # a module without kernels fails: nothing to read
        for name, regs in re.findall(r"entry function '(\w+)'.*?Used (\d+) registers", info, re.DOTALL):
            if case and re.fullmatch(r"(residual_)?layer_norm_(fwd|bwd)|bias_gelu_(fwd|bwd)", name):
                found[f"{case.group(1)}: {name}"] = int(regs)
    return found


def compile_kernels(target: str, rows: int, tiling, dump_dir: str) -> None:
    import jax
    import jax.numpy as jnp

    from andrea_jax import aot, kernels
    from andrea_jax.kernels import pallas_ops, platform

    D, F = 768, 3072
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    bf16 = lambda *s: jax.ShapeDtypeStruct(s, jnp.bfloat16)
    cases = {  # name -> (op, abstract args); y in bf16 as in the train step
        "ln": (lambda x, g, b: kernels.layer_norm(x, g, b, impl="pallas", y_dtype=jnp.bfloat16),
               (f32(rows, D), f32(D), f32(D))),
        "res_ln": (lambda x, d, g, b: kernels.residual_layer_norm(x, d, jnp.float32(0.5), g, b, impl="pallas",
                                                                 y_dtype=jnp.bfloat16),
                   (f32(rows, D), bf16(rows, D), f32(D), f32(D))),
        "res_ln_dalpha": (lambda x, d, a, g, b: kernels.residual_layer_norm(x, d, a, g, b, impl="pallas",
                                                                           y_dtype=jnp.bfloat16),
                          (f32(rows, D), bf16(rows, D), f32(), f32(D), f32(D))),
        "gelu": (lambda h, b: kernels.bias_gelu(h, b, impl="pallas"), (bf16(rows, F), f32(F))),
    }
    (device,) = aot.gpu_devices(target, 1)
    previous = (platform.TARGET_BACKEND, pallas_ops.GPU_TILING)
    platform.TARGET_BACKEND, pallas_ops.GPU_TILING = "gpu", tiling
    try:
        for name, (op, args) in cases.items():
            def fwd_bwd(*primals, op=op):
                out, vjp = jax.vjp(op, *primals)
                return vjp(out)
            fwd_bwd.__name__ = f"case_{name}"  # names the dumped module
            sharding = jax.sharding.SingleDeviceSharding(device)
            args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in args]
            jax.jit(fwd_bwd).lower(*args).compile()
    finally:
        platform.TARGET_BACKEND, pallas_ops.GPU_TILING = previous


def measure(target: str, rows: int, tiling) -> dict[str, int]:
    """Compiles in a child process: XLA reads its dump flag once per process."""
    with tempfile.TemporaryDirectory() as dump:
        here = str(pathlib.Path(__file__).parent)
        code = (f"import sys; sys.path.insert(0, {here!r}); import kernel_registers as k; "
                f"from andrea_jax.kernels import pallas_ops; "
                f"k.compile_kernels({target!r}, {rows}, pallas_ops.{tiling!r}, {dump!r})")
        env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3",
                   XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump}")
        subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True)
        arch = "sm_90a" if target in ("h100", "h200") else "sm_80"
        return registers(dump, arch)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="h200")
    parser.add_argument("--rows", type=int, default=8192, help="rows of the [rows, 768] stream (8 x 1024 tokens)")
    parser.add_argument("--sweep", action="store_true", help="also the backward at other tile sizes and warps")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from andrea_jax import startup
    with startup.native_stderr_silenced():
        from andrea_jax.kernels import pallas_ops

    shipped = pallas_ops.GPU_TILING
    tilings = [("shipped", shipped)]
    if args.sweep:
        tilings += [(f"bwd {e} elems / {w} warps", dataclasses.replace(shipped, bwd_tile_elems=e, bwd_warps=w))
                    for e, w in ((4096, 4), (2048, 4), (1024, 4), (4096, 8), (2048, 8))
                    if (e, w) != (shipped.bwd_tile_elems, shipped.bwd_warps)]
    print(f"{args.target}, rows {args.rows}; registers per thread, and the CTAs (warps) an SM holds by registers\n")
    print("| tiling | kernel | warps | registers | CTAs / SM | occupancy |")
    print("|---|---|---|---|---|---|")
    for label, tiling in tilings:
        for name, regs in sorted(measure(args.target, args.rows, tiling).items()):
            warps = (tiling.bwd_warps if name.endswith("norm_bwd") else
                     tiling.norm_warps if "norm" in name else tiling.gelu_warps)
            ctas = ctas_per_sm(regs, warps)
            print(f"| {label} | {name} | {warps} | {regs} | {ctas} | {100 * ctas * warps / WARPS_PER_SM:.0f}% |",
                  flush=True)


if __name__ == "__main__":
    main()
