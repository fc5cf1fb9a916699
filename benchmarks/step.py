"""Compile time, step time and memory of the train step by depth, for each model.remat policy.

    python benchmarks/step.py                                  # depth:family=tiny,layers={12..120}, none|full|dots
    python benchmarks/step.py --family 71m --depths 12,120 --remat full --batch 8   # on a GPU

The depth:family=F,layers=L configs (configs/depth.py) at their own width, synthetic tokens, one device.
Per row (benchmarks/train_step.py `measure`): compile = lowering + XLA compilation of the whole
train step (forward, backward, clipping, AdamW); step = median of `--steps` steps after 2
warm-up steps, and the median CPU time (all threads of the process) of a step, which other
jobs on a shared machine disturb less than the wall clock; memory from the compiled step's
memory_analysis(), nothing allocated to measure it: `temp` is XLA's scratch (the activations
kept for the backward pass, gradients, workspace) and `peak` = arguments (parameters, Adam
moments, tokens) + outputs - donated + temp. On CPU these are the CPU compiler's buffers, an
estimate of a GPU's.

Checked and printed (never asserted): compile time nearly flat in depth (the blocks are one
scanned body; the target is compile(120) <= 1.5 x compile(12)), and step time linear in depth
(a least-squares line through the rows, with the largest relative miss of any row), fitted to
the median step time and to the CPU time.
"""
from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from andrea_jax import config as config_lib  # noqa: E402
from andrea_jax.configs.depth import DEPTHS, depth_config  # noqa: E402
from train_step import measure  # noqa: E402


def linear_fit(depths, step_s) -> tuple[float, float, float]:
    """(seconds per layer, intercept, largest |measured - line| / measured)."""
    slope, intercept = np.polyfit(np.asarray(depths, float), np.asarray(step_s, float), 1)
    fitted = slope * np.asarray(depths) + intercept
    return float(slope), float(intercept), float(np.max(np.abs(np.asarray(step_s) - fitted) / np.asarray(step_s)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="tiny")
    parser.add_argument("--depths", default=",".join(map(str, DEPTHS)))
    parser.add_argument("--remat", default=",".join(config_lib.REMATS))
    parser.add_argument("--batch", type=int, default=None, help="global batch; default the config's")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per row (after 2 warm-up steps)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")]

    rows = {}
    mib = lambda b: f"{b / 2**20:,.1f}"
    print("| remat | layers | params | compile (s) | step (ms) | step, CPU time (ms) | tokens/s | "
          "temp (MiB) | peak (MiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    for remat in args.remat.split(","):
        for L in depths:
            cfg = config_lib.override(depth_config(args.family, L), [f"model.remat={remat}", *args.set])
            if args.batch:
                cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=args.batch))
            r = measure(config_lib.validate(cfg), args.steps, None)
            rows[remat, L] = r
            print(f"| {remat} | {L} | {r['params'] / 1e6:.2f}M | {r['compile_s']:.1f} | {1e3 * r['step_s']:.1f} | "
                  f"{1e3 * r['step_cpu_s']:.1f} | "
                  f"{r['tokens_per_s']:,.0f} | {mib(r['temp_bytes'])} | {mib(r['peak_bytes'])} |", flush=True)

    print()
    lo, hi = min(depths), max(depths)
    for remat in args.remat.split(","):
        c = rows[remat, hi]["compile_s"] / rows[remat, lo]["compile_s"]
        fits = []
        for label, key in (("wall", "step_s"), ("CPU time", "step_cpu_s")):
            slope, intercept, miss = linear_fit(depths, [rows[remat, L][key] for L in depths])
            fits.append(f"step ({label}) = {1e3 * intercept:.1f} ms + {1e3 * slope:.2f} ms/layer, "
                        f"largest miss of the line {100 * miss:.0f}%")
        print(f"remat {remat}: compile {hi} / {lo} layers = {c:.2f}x (want <= 1.5x); {'; '.join(fits)}; "
              f"temp {hi} / {lo} layers = {rows[remat, hi]['temp_bytes'] / rows[remat, lo]['temp_bytes']:.1f}x")
    if "none" in args.remat.split(","):
        for remat in args.remat.split(","):
            if remat != "none":
                saved = 1 - rows[remat, hi]["temp_bytes"] / rows["none", hi]["temp_bytes"]
                print(f"remat {remat} at {hi} layers: temp {100 * saved:.0f}% below none")


if __name__ == "__main__":
    main()
