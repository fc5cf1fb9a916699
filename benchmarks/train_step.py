"""Train-step throughput and MFU of a config on synthetic tokens (no data pipeline in the way).

    python benchmarks/train_step.py --config andrea_120m --batch 32 --steps 20      # on a GPU
    python benchmarks/train_step.py --config tiny --steps 5 --peak-tflops 0.1       # smoke test on CPU

MFU = model FLOPs per token (andrea_jax.model.flops_per_token: 6 x matmul parameters + attention)
x tokens per second / peak. The default peak is the H200's dense bf16 rate, 989 TFLOP/s.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from andrea_jax import config as config_lib, model as model_lib, steps  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="andrea_120m")
    parser.add_argument("--batch", type=int, default=32, help="global batch in sequences")
    parser.add_argument("--steps", type=int, default=20, help="timed steps (after 2 warm-up steps)")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args(argv)

    cfg = config_lib.load(args.config)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=args.batch))
    cfg = config_lib.validate(config_lib.override(cfg, args.set))
    mesh = steps.make_mesh(cfg)  # cfg.mesh: e.g. --set mesh.fsdp=8
    state = steps.create_state(cfg, jax.random.key(0), mesh)
    step = steps.make_train_step(cfg, mesh)
    S = cfg.model.seq_len
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, cfg.model.vocab_size, (args.batch, S + 1), dtype=np.int32) for _ in range(4)]

    t0 = time.perf_counter()
    for i in range(2):  # compile + one warm step
        state, metrics = step(state, batches[i % 4])
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(args.steps):
        state, metrics = step(state, batches[i % 4])
    jax.block_until_ready(metrics)
    dt = (time.perf_counter() - t0) / args.steps

    tokens_per_sec = args.batch * S / dt
    flops = model_lib.flops_per_token(cfg.model, S)
    result = {
        "config": args.config, "overrides": args.set, "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
        "params": sum(int(p.size) for p in jax.tree.leaves(state.params)), "batch": args.batch,
        "seq_len": S, "dtype": cfg.model.dtype, "kernels": cfg.kernels.impl, "remat": cfg.model.remat,
        "step_ms": round(dt * 1e3, 2), "tokens_per_sec": round(tokens_per_sec),
        "model_tflops": round(flops * tokens_per_sec / 1e12, 2),
        "mfu": round(flops * tokens_per_sec / (args.peak_tflops * 1e12 * jax.device_count()), 4),
        "compile_and_first_steps_s": round(compile_s, 1), "loss": float(metrics["loss"]),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
