"""Compile the train and eval steps for a GPU that is not here, and read what XLA:GPU made of them.

    python -m andrea_jax.aot --target h200 --config andrea_120m --set train.batch_size=8
    python -m andrea_jax.aot --target h100 --config andrea_120m --devices 8 --set mesh.fsdp=8

Needs the `gpu-compile` extra (the CUDA PJRT plugin and ptxas; no GPU, no driver). JAX lowers the
steps for the `cuda` platform and the plugin, given the target's description (andrea_jax/aot/targets/
NAME.txtpb), runs XLA:GPU's whole pipeline: fusion, scheduling, buffer assignment, Pallas ->
Triton -> PTX -> ptxas for the kernels, cuDNN graphs for flash attention. `--devices N` compiles
for N such GPUs (8 per host) under the config's mesh. Nothing is allocated and nothing runs.

Printed per step: compile time; per-device bytes of arguments, outputs, aliased (donated) and XLA's
temporaries, and the peak (arguments + outputs - aliased + temporaries); the train step's FLOPs
from XLA's cost analysis next to andrea_jax/train/mfu.py's count; the tokens/s that 50% MFU would
be; the kernels in the program. The peak excludes cuBLAS / cuDNN workspace and the CUDA context.
With --roofline, each step's roofline bound (andrea_jax/aot/roofline.py): per device, the time no
run of the compiled program can beat at the target's datasheet FLOP/s and bandwidth, the MFU that
bound allows, and the 10 kernels that bound most, each compute- or memory-bound.
`--population N` compiles the train step of a population of N members of the config instead (one
vmapped step, andrea_jax.train.population): the memory a population of small models needs.

Exit 0: every step compiled and fits; 1: a step does not compile, or its peak exceeds the memory
JAX would give it (the target's memory x XLA_PYTHON_CLIENT_MEM_FRACTION, 0.75 unless set); 2: a
bad config or command. Each failure is one line on stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from andrea_jax.startup import native_stderr_silenced
from andrea_jax.aot import roofline
from andrea_jax.aot.compile import StepReport, compile_steps, unsupported_jax
from andrea_jax.aot.gpus import TARGETS, gpu_devices, target_compute_capability, target_kind, target_memory

DEFAULT_MEM_FRACTION = 0.75  # JAX's preallocation default (XLA_PYTHON_CLIENT_MEM_FRACTION)


def mem_fraction() -> float:
    return float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", DEFAULT_MEM_FRACTION))


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def describe(cfg, target: str, n_devices: int, reports: list[StepReport], population: int = 0) -> list[str]:
    from andrea_jax.train import mfu as mfu_lib

    memory = target_memory(target)
    usable = memory * mem_fraction()
    kind = target_kind(target)
    tokens = cfg.train.batch_size * cfg.model.seq_len
    model_flops = mfu_lib.model_flops_per_token(cfg.model) * tokens * max(1, population)
    peak_flops = mfu_lib.peak_flops(kind) or 0.0
    lines = [f"target {target} ({kind}) x {n_devices}: {gib(memory)} per GPU, {gib(usable)} usable at "
             f"XLA_PYTHON_CLIENT_MEM_FRACTION={mem_fraction():g}"]
    if population:
        lines.append(f"population of {population} member{'s' * (population != 1)}: one vmapped train step on a "
                     "shared batch (andrea_jax.train.population); FLOPs below are all members'")
    for r in reports:
        lines.append(f"{r.step} step: compiled in {r.compile_s:.1f} s; per device: arguments {gib(r.argument_bytes)}, "
                     f"outputs {gib(r.output_bytes)}, aliased {gib(r.alias_bytes)}, temporaries {gib(r.temp_bytes)}, "
                     f"peak {gib(r.peak_bytes)} ({100 * r.peak_bytes / memory:.1f}% of the GPU)")
        kernels = ", ".join(f"{k} {v}" for k, v in r.kernels.items())
        matmuls = ", ".join(f"{k}: {v}" for k, v in sorted(r.matmuls.items()))
        lines.append(f"{r.step} step kernels: {kernels}; convert-only kernels {r.convert_fusions}; matmuls {matmuls}")
        for target, shapes in r.attention_calls.items():  # a fourth operand: the mask, as a bias
            lines.append(f"{r.step} step cuDNN attention: {target}({', '.join(shapes)})")
        if r.step == "train":
            xla = "n/a" if r.flops is None else f"{r.flops:.4g}"
            lines.append(f"train step FLOPs: XLA cost analysis {xla}; mfu.py (model, per step) {model_flops:.4g}")
            if peak_flops:
                at_half = 0.5 * peak_flops * n_devices / (model_flops / tokens)
                lines.append(f"50% MFU would be {at_half:,.0f} tokens/s ({at_half / n_devices:,.0f} per GPU; "
                             f"{tokens:,} tokens per step: {tokens / at_half * 1e3:.1f} ms a step)")
    return lines


def step_model_flops(cfg, step: str, population: int = 0) -> float:
    """The model's FLOPs in one run of a step, as mfu.py counts them: the eval step is the forward, a third;
    a population's train step, every member's."""
    from andrea_jax.train import mfu as mfu_lib
    per_step = mfu_lib.model_flops_per_token(cfg.model) * cfg.train.batch_size * cfg.model.seq_len
    return per_step * max(1, population) if step == "train" else per_step / 3


def write_outputs(args, cfg, reports: list[StepReport]) -> None:
    """What the command prints or writes besides the description: --roofline, --dump-hlo, --json."""
    bounds = {r.step: roofline.roofline(r.hlo, args.target) for r in reports} if args.roofline else {}
    per_device = lambda step: step_model_flops(cfg, step, args.population) / args.devices
    for step, bound in bounds.items():
        print(f"{step} step " + "\n".join(bound.lines(per_device(step))), flush=True)
    if args.dump_hlo:
        os.makedirs(args.dump_hlo, exist_ok=True)
        for r in reports:
            with open(os.path.join(args.dump_hlo, f"{r.step}.hlo"), "w") as f:
                f.write(r.hlo)
    if args.json:
        from andrea_jax.train import sharding
        with open(args.json, "a") as f:
            for r in reports:
                bound = {"roofline": bounds[r.step].as_dict(per_device(r.step))} if r.step in bounds else {}
                f.write(json.dumps({"target": args.target, "config": args.config, "set": args.set,
                                    "devices": args.devices, "mesh": list(sharding.mesh_shape(cfg.mesh, args.devices)),
                                    **({"population": args.population} if args.population else {}),
                                    **r.as_dict(), **bound}) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, choices=TARGETS, help="the GPU to compile for")
    parser.add_argument("--config", required=True, help="a name in configs/ or a path to a .py config")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config field; repeatable")
    parser.add_argument("--devices", type=int, default=1, help="GPUs to compile for, under the config's mesh")
    parser.add_argument("--no-eval", action="store_true", help="compile the train step only")
    parser.add_argument("--json", help="also append one JSON line per step to this file")
    parser.add_argument("--dump-hlo", help="write each step's optimized HLO to DIR/STEP.hlo")
    parser.add_argument("--population", type=int, default=0, metavar="N",
                        help="the train step of a population of N members of the config instead (one vmapped step, "
                             "andrea_jax.train.population; its members evaluate with the solo eval step)")
    parser.add_argument("--roofline", action="store_true",
                        help="print each step's roofline bound and its 10 costliest kernels (aot/roofline.py)")
    args = parser.parse_args(argv)
    unsupported = unsupported_jax()
    if unsupported:
        print(f"error: {unsupported}", file=sys.stderr)
        return 2
    # The plugin's CUDA version check needs a GPU's runtime; JAX skips it when cuda is not a
    # platform it is asked to run on, and still registers the plugin for its topology.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    with native_stderr_silenced():  # the CUDA plugin's "no driver" lines
        import jax
        jax.devices("cpu")  # discovers and loads the plugins
    from andrea_jax import config as config_lib, configs
    from andrea_jax.errors import ConfigError

    try:
        cfg = config_lib.validate(config_lib.override(configs.load(args.config), args.set))
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.devices < 1:
        print(f"config error: --devices {args.devices}: need at least 1", file=sys.stderr)
        return 2
    if args.population < 0:
        print(f"config error: --population {args.population}: need at least 1 member (0: no population)",
              file=sys.stderr)
        return 2
    try:
        devices = gpu_devices(args.target, args.devices)
    except (ValueError, NotImplementedError, RuntimeError) as e:
        hint = "" if isinstance(e, ValueError) else " (install the gpu-compile extra: pip install -e '.[gpu-compile]')"
        print(f"error: no {args.target} topology: {' '.join(str(e).split())}{hint}", file=sys.stderr)
        return 1 if not isinstance(e, ValueError) else 2
    try:
        reports = compile_steps(cfg, devices, eval_step=not args.no_eval, population=args.population,
                                compute_capability=target_compute_capability(args.target))
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # XLA's own errors (an unsupported op, a failed ptxas) end in one line
        first = next((l for l in str(e).splitlines() if l.strip()), type(e).__name__)
        print(f"error: {args.config} does not compile for {args.target}: {type(e).__name__}: {first[:400]}",
              file=sys.stderr)
        return 1
    for line in describe(cfg, args.target, args.devices, reports, args.population):
        print(line, flush=True)
    write_outputs(args, cfg, reports)
    usable = target_memory(args.target) * mem_fraction()
    over = [r for r in reports if r.peak_bytes > usable]
    if over:
        r = max(over, key=lambda r: r.peak_bytes)
        print(f"error: {args.config} does not fit one {args.target}: the {r.step} step's peak {gib(r.peak_bytes)} "
              f"per device exceeds the {gib(usable)} JAX gives it ({gib(target_memory(args.target))} x "
              f"XLA_PYTHON_CLIENT_MEM_FRACTION={mem_fraction():g}); lower train.batch_size, raise "
              f"train.microbatches or model.remat, or shard over more devices", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
