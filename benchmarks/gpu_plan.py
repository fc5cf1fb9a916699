"""The order of gpu_all.sh's train-step variants, from compiling each one for the GPU here (no GPU).

    python benchmarks/gpu_plan.py                  # writes benchmarks/gpu_plan.json (committed)

Every variant of the cross (remat x attention x kernels, andrea_120m bf16 at batch 64) is compiled
by `andrea_jax.aot` for the target: its peak memory says whether it fits the memory gpu_all.sh
gives JAX (XLA_PYTHON_CLIENT_MEM_FRACTION 0.95), its compile time what it costs. The plan keeps the
variants that fit, in the order that answers the open questions first:
  1. kernels.impl xla against pallas, at the least recomputation that fits, with cuDNN attention:
     the pair that decides kernels.impl=auto, in the setting a run would use;
  2. the same pair with XLA's attention: the pair that decides model.attention=auto;
  3. then each next remat (more recomputation, less memory), in the same order.
Each variant's estimated seconds are its compile here (deviceless: no autotuning, 2 CPU cores)
plus 2 warm-up and the timed steps at 40% MFU; benchmarks/train_step.py --plan runs them in this
order, records the ones that do not fit as skipped, and its --budget-s stops the rest.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

REMAT_ORDER = ("none", "dots", "full")  # less recomputation first
ATTENTION_ORDER = ("cudnn", "xla")
KERNELS_ORDER = ("xla", "pallas")


def order_key(overrides: list[str]) -> tuple:
    """Run order: remat (least recomputation first), then attention, then kernels (adjacent pairs)."""
    setting = dict(o.split("=", 1) for o in overrides)
    rank = lambda key, order: order.index(setting[key]) if setting.get(key) in order else len(order)
    return (rank("model.remat", REMAT_ORDER), rank("model.attention", ATTENTION_ORDER),
            rank("kernels.impl", KERNELS_ORDER))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="h200")
    parser.add_argument("--config", default="andrea_120m")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant (gpu_all.sh's)")
    parser.add_argument("--mem-fraction", type=float, default=0.95, help="gpu_all.sh's XLA_PYTHON_CLIENT_MEM_FRACTION")
    parser.add_argument("--set", action="append", default=["model.dtype=bfloat16", "model.seq_len=1024"])
    parser.add_argument("--cross", action="append", default=None)
    parser.add_argument("--out", default=str(pathlib.Path(__file__).parent / "gpu_plan.json"))
    args = parser.parse_args(argv)
    crosses = args.cross or ["model.remat=none,dots,full", "model.attention=cudnn,xla", "kernels.impl=xla,pallas"]
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from andrea_jax import startup
    from andrea_jax import aot
    with startup.native_stderr_silenced():
        import jax
        jax.devices("cpu")
    from andrea_jax import config as config_lib, configs
    from andrea_jax.train import mfu as mfu_lib
    from train_step import variants

    base = config_lib.override(configs.load(args.config), args.set)
    base = dataclasses.replace(base, train=dataclasses.replace(base.train, batch_size=args.batch))
    usable = aot.target_memory(args.target) * args.mem_fraction
    tokens = args.batch * base.model.seq_len
    peak_flops = mfu_lib.peak_flops(aot.target_kind(args.target))
    step_s = tokens * mfu_lib.model_flops_per_token(base.model) / (0.4 * peak_flops)
    devices = aot.gpu_devices(args.target, 1)
    planned = []
    for overrides in sorted(variants(crosses), key=order_key):
        cfg = config_lib.validate(config_lib.override(base, overrides))
        (report,) = aot.compile_steps(cfg, devices, eval_step=False, count_flops=False)
        entry = {"overrides": overrides, "peak_gib": round(report.peak_bytes / 2**30, 2),
                 "peak_bytes": report.peak_bytes, "fits": report.peak_bytes <= usable,
                 "compile_s": round(report.compile_s, 1),
                 "est_s": round(report.compile_s + (2 + args.steps) * step_s, 1)}
        planned.append(entry)
        print(json.dumps(entry), flush=True)
    plan = {"target": args.target, "config": args.config, "batch": args.batch, "set": args.set,
            "usable_gib": round(usable / 2**30, 2), "est_step_s_at_40pct_mfu": round(step_s, 4),
            "est_total_s": round(sum(v["est_s"] for v in planned if v["fits"]), 1), "variants": planned}
    pathlib.Path(args.out).write_text(json.dumps(plan, indent=1) + "\n")
    print(f"{sum(v['fits'] for v in planned)} of {len(planned)} variants fit {plan['usable_gib']} GiB; "
          f"estimated {plan['est_total_s']:.0f} s for them; plan in {args.out}")


if __name__ == "__main__":
    main()
