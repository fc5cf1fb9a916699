"""Train-step throughput, MFU and memory of a config on synthetic tokens (no data pipeline in the way).

    python benchmarks/train_step.py --config andrea_120m --batch 64 --steps 10          # on a GPU
    python benchmarks/train_step.py --config andrea_120m --batch 64 --set model.dtype=bfloat16 \\
        --cross model.remat=none,dots,full --cross model.attention=cudnn,xla --cross kernels.impl=xla,pallas \\
        --jsonl results.jsonl --phase train_step --budget-s 240
    python benchmarks/train_step.py --config tiny --steps 5                              # CPU smoke test
    python benchmarks/train_step.py --config tiny --batch 16 --steps 20 \
        --cross data.document_mask=false,true,false,true                                 # docs/BENCHMARKS.md

Each `--cross KEY=V1,V2` multiplies the variants (the first --cross varies slowest, so put the
most important first: a budget stops the later ones). Each variant is compiled, run for 2
warm-up steps and `--steps` timed steps (each waited for; the median is the step time), and its
result is printed and appended to `--jsonl` at once, one JSON object per line:

    tokens_per_s   batch x seq_len / median step time (step_s; step_min_s the fastest step;
                   step_cpu_s the median CPU time of this process's threads per step, which a
                   loaded shared CPU machine disturbs less than the wall clock)
    mfu            andrea_jax/train/mfu.py (6 x matmul weights + causal attention, per token) x tokens/s
                   / peak FLOP/s of the chips; null where the device has no known peak (a CPU)
    peak_bytes     the compiled step's own memory: arguments + outputs - donated + XLA's temp
                   (activations kept for the backward pass, gradients, workspace), from
                   memory_analysis(): per variant, the same measure on CPU and GPU
    device_peak_bytes_in_use  the allocator's peak so far in this process (GPU only; never reset,
                   so it is a running maximum over the variants run before)
    bound_step_s, bound_mfu   GPU only: the roofline bound of the program that ran
                   (andrea_jax/aot/roofline.py), a lower bound on step_s and an upper one on mfu

A variant that runs out of memory is retried at half the batch with `--halve-on-oom` (the batch
that "fills the chip"); one that fails otherwise, or is not started within `--budget-s`, gets a
line with `error` or `skipped` and the next one runs.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from andrea_jax import kernels  # noqa: E402
from andrea_jax.train import mfu as mfu_lib  # noqa: E402
from andrea_jax import config as config_lib, configs, model as model_lib  # noqa: E402
from andrea_jax.train import steps


def variants(crosses: list[str]) -> list[list[str]]:
    """`--cross` settings -> one list of `section.key=value` overrides per variant."""
    axes = []
    for cross in crosses:
        key, sep, values = cross.partition("=")
        if not sep or not values:
            raise SystemExit(f"--cross {cross!r} is not of the form section.key=v1,v2")
        axes.append([f"{key}={v}" for v in values.split(",")])
    return [list(v) for v in itertools.product(*axes)]


def is_oom(err: Exception) -> bool:
    text = str(err)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def measure(cfg: config_lib.Config, n_steps: int, peak_per_chip: float | None) -> dict:
    mesh = steps.make_mesh(cfg)
    state = steps.create_state(cfg, jax.random.key(0), mesh)
    B, S, V = cfg.train.batch_size, cfg.model.seq_len, cfg.model.vocab_size
    rng = np.random.default_rng(0)
    tokens = [jax.device_put(rng.integers(0, V, (B, S + 1), dtype=np.int32), steps.batch_sharding(cfg, mesh))
              for _ in range(2)]
    t0 = time.perf_counter()
    compiled = steps.make_train_step(cfg, mesh).lower(state, tokens[0]).compile()
    compile_s = time.perf_counter() - t0
    memory = compiled.memory_analysis()
    times, cpu_times = [], []
    for i in range(2 + n_steps):  # 2 warm-up steps, then the timed ones
        t0, c0 = time.perf_counter(), time.process_time()
        state, metrics = compiled(state, tokens[i % 2])
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    step_s = statistics.median(times[2:])
    tokens_per_s = B * S / step_s
    flops = mfu_lib.model_flops_per_token(cfg.model, S)
    stats = jax.devices()[0].memory_stats() or {}
    used = mfu_lib.mfu(tokens_per_s, flops, peak_per_chip, jax.device_count())
    return roofline_bound(compiled.as_text(), flops * B * S / jax.device_count()) | {
        "params": sum(int(p.size) for p in jax.tree.leaves(state.params)),
        "step_s": step_s, "step_min_s": min(times[2:]),
        "step_cpu_s": statistics.median(cpu_times[2:]), "tokens_per_s": tokens_per_s, "flops_per_token": flops,
        "model_tflops_per_s": flops * tokens_per_s / 1e12,
        "mfu": None if used is None else round(used, 4),
        "peak_bytes": (memory.argument_size_in_bytes + memory.output_size_in_bytes
                       - memory.alias_size_in_bytes + memory.temp_size_in_bytes),
        "temp_bytes": memory.temp_size_in_bytes, "argument_bytes": memory.argument_size_in_bytes,
        "device_peak_bytes_in_use": stats.get("peak_bytes_in_use"),
        "compile_s": compile_s, "loss": float(metrics["loss"]),
    }


def roofline_bound(hlo_text: str, model_flops: float) -> dict:
    """On a GPU the aot roofline of the very program that ran (andrea_jax/aot/roofline.py): the
    lower bound on its step and the MFU that allows, beside the measured ones; {} elsewhere."""
    from andrea_jax.aot import roofline
    kind = jax.devices()[0].device_kind
    target = next((t for t in roofline.DATASHEET if t.upper() in kind.upper()), None)
    if jax.devices()[0].platform != "gpu" or target is None:
        return {}
    bound = roofline.roofline(hlo_text, target)
    return {"bound_step_s": bound.seconds, "bound_mfu": round(bound.max_mfu(model_flops), 4)}


def run_variant(base: config_lib.Config, overrides: list[str], args, peak_per_chip) -> dict:
    cfg = config_lib.validate(config_lib.override(base, overrides))
    record = {
        "phase": args.phase, "config": args.config, "overrides": overrides,
        "device_kind": jax.devices()[0].device_kind, "n_devices": jax.device_count(),
        "peak_flops_per_chip": peak_per_chip, "seq_len": cfg.model.seq_len, "dtype": cfg.model.dtype,
        "attention": model_lib.attention_impl(cfg.model)[0], "kernels": kernels.resolve(cfg.kernels.impl),
        "remat": cfg.model.remat, "microbatches": cfg.train.microbatches, "oom_batches": [],
    }
    batch = cfg.train.batch_size
    while True:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=batch))
        try:
            return record | {"batch": batch} | measure(config_lib.validate(cfg), args.steps, peak_per_chip)
        except Exception as err:  # one failing variant (a lowering, memory) must not hide the others
            smaller = batch // 2
            if args.halve_on_oom and is_oom(err) and smaller % cfg.train.microbatches == 0 and smaller > 0:
                record["oom_batches"].append(batch)
                batch = smaller
                continue
            return record | {"batch": batch, "error": f"{type(err).__name__}: {' '.join(str(err).split())[:400]}"}


def size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def describe(r: dict) -> str:
    if "error" in r or "skipped" in r:
        return f"{r['phase']} {' '.join(r['overrides'])}: {r.get('error') or 'skipped: ' + r['skipped']}"
    mfu = "n/a (no peak for this device)" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
    return (f"{r['phase']} {' '.join(r['overrides']) or '(defaults)'} [attention {r['attention']}, kernels "
            f"{r['kernels']}, remat {r['remat']}, batch {r['batch']} x {r['microbatches']} microbatches]: "
            f"{r['tokens_per_s']:,.0f} tokens/s, MFU {mfu}, peak memory {size(r['peak_bytes'])}, "
            f"step {1e3 * r['step_s']:.1f} ms, compile {r['compile_s']:.1f} s"
            + (f"; roofline bound {1e3 * r['bound_step_s']:.1f} ms, MFU <= {100 * r['bound_mfu']:.1f}%"
               if "bound_step_s" in r else ""))


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="andrea_120m")
    parser.add_argument("--batch", type=int, default=32, help="global batch in sequences")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (after 2 warm-up steps)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="peak per chip; default from the device kind (andrea_jax/train/mfu.py), none on CPU")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="applies to every variant")
    parser.add_argument("--cross", action="append", default=[], metavar="SECTION.KEY=V1,V2,...")
    parser.add_argument("--jsonl", help="append one JSON line per variant here, as soon as it is measured")
    parser.add_argument("--phase", default="train_step", help="the `phase` field of the records")
    parser.add_argument("--budget-s", type=float, default=float("inf"), help="start no variant after this")
    parser.add_argument("--halve-on-oom", action="store_true", help="retry a variant out of memory at half the batch")
    parser.add_argument("--plan", help="benchmarks/gpu_plan.json: run its variants in its order (in place of "
                        "--cross), recording those that do not fit as skipped")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    base = configs.load(args.config)
    base = dataclasses.replace(base, train=dataclasses.replace(base.train, batch_size=args.batch))
    base = config_lib.override(base, args.set)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else mfu_lib.peak_flops(jax.devices()[0].device_kind)
    print(f"jax {jax.__version__}, {jax.device_count()} x {jax.devices()[0].device_kind}, "
          f"peak {peak / 1e12 if peak else 'unknown'} TFLOP/s per chip", flush=True)
    results = []
    unfit = {}
    if args.plan:
        plan = json.loads(pathlib.Path(args.plan).read_text())
        todo = [v["overrides"] for v in plan["variants"]]
        unfit = {tuple(v["overrides"]): f"does not fit {plan['usable_gib']} GiB ({plan['target']}, andrea_jax.aot: "
                 f"peak {v['peak_gib']} GiB)" for v in plan["variants"] if not v["fits"]}
    else:
        todo = variants(args.cross)
    for overrides in todo:
        if tuple(overrides) in unfit:
            record = {"phase": args.phase, "config": args.config, "overrides": overrides,
                      "skipped": unfit[tuple(overrides)]}
        elif time.perf_counter() - start > args.budget_s:
            record = {"phase": args.phase, "config": args.config, "overrides": overrides,
                      "skipped": f"not started within --budget-s {args.budget_s:.0f}"}
        else:
            record = run_variant(base, args.set + overrides, args, peak)
            record["overrides"], record["set"] = overrides, args.set
        record["time"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        results.append(record)
        print(describe(record), flush=True)
        print(json.dumps(record), flush=True)
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(json.dumps(record) + "\n")
    return results


if __name__ == "__main__":
    sys.exit(1 if any("error" in r for r in main()) else 0)
