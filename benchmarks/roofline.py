"""The roofline bound of andrea_120m's train step on one GPU, across remat, attention and kernels,
as XLA:GPU compiles it without a GPU (andrea_jax/aot/roofline.py; the gpu-compile extra):

    python benchmarks/roofline.py                          # the docs/BENCHMARKS.md table (H200, 64 rows)
    python benchmarks/roofline.py --target h100 --batch 16 --json out.jsonl

Per setting: the lower bound on the step's time, the part of it spent in memory-bound kernels, the
MFU the bound allows, the peak memory, and the kernels that bound most. A bound, never a
measurement: a real step adds launch gaps, imperfect overlap and kernels below their roofline.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

SETTINGS = [(remat, attention, impl) for remat in ("none", "dots", "full")
            for attention, impl in (("xla", "xla"), ("cudnn", "xla"), ("cudnn", "pallas"))]


def measure(cfg, target: str, devices) -> dict:
    from andrea_jax import aot
    from andrea_jax.aot import roofline
    from andrea_jax.aot.__main__ import step_model_flops

    (report,) = aot.compile_steps(cfg, devices, eval_step=False, count_flops=False,
                                  compute_capability=aot.target_compute_capability(target))
    bound = roofline.roofline(report.hlo, target)
    peak, bandwidth = bound.peak, bound.bandwidth
    top = sorted(bound.kernels, key=lambda k: -k.seconds(peak, bandwidth))[:3]
    return {**bound.as_dict(step_model_flops(cfg, "train")), "peak_bytes": report.peak_bytes,
            "top": [f"{k.kind} {k.name} x{k.count} ({k.bound_by(peak, bandwidth)}, "
                    f"{k.seconds(peak, bandwidth) * 1e3:.2f} ms)" for k in top]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="h200")
    parser.add_argument("--config", default="andrea_120m")
    parser.add_argument("--batch", type=int, default=64, help="rows of seq_len tokens per step")
    parser.add_argument("--json", help="also append one JSON line per setting to this file")
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the CUDA plugin compiles; nothing runs on a GPU
    from andrea_jax.startup import native_stderr_silenced
    with native_stderr_silenced():
        import jax
        jax.devices("cpu")
    from andrea_jax import aot, config as config_lib, configs

    devices = aot.gpu_devices(args.target, 1)
    print("| remat | attention | kernels | step >= (ms) | memory-bound (ms) | MFU <= | peak (GiB) "
          "| costliest kernels |")
    print("|---|---|---|---|---|---|---|---|")
    for remat, attention, impl in SETTINGS:
        cfg = config_lib.validate(config_lib.override(configs.load(args.config), [
            f"train.batch_size={args.batch}", f"model.remat={remat}", f"model.attention={attention}",
            f"kernels.impl={impl}"]))
        row = measure(cfg, args.target, devices)
        print(f"| {remat} | {attention} | {impl} | {row['bound_s'] * 1e3:.1f} | {row['memory_bound_s'] * 1e3:.1f} | "
              f"{100 * row['max_mfu']:.1f}% | {row['peak_bytes'] / 2**30:.1f} | {'; '.join(row['top'])} |", flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"target": args.target, "config": args.config, "batch": args.batch,
                                    "remat": remat, "attention": attention, "kernels": impl, **row}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
