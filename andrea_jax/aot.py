"""Compile the train and eval steps for a GPU that is not here, and read what XLA:GPU made of them.

    python -m andrea_jax.aot --target h200 --config andrea_120m --set train.batch_size=8
    python -m andrea_jax.aot --target h100 --config andrea_120m --devices 8 --set mesh.fsdp=8

Needs the `gpu-compile` extra (the CUDA PJRT plugin and ptxas; no GPU, no driver). JAX lowers the
steps for the `cuda` platform and the plugin, given the target's description (andrea_jax/targets/
NAME.txtpb), runs XLA:GPU's whole pipeline: fusion, scheduling, buffer assignment, Pallas ->
Triton -> PTX -> ptxas for the kernels, cuDNN graphs for flash attention. `--devices N` compiles
for N such GPUs (8 per host) under the config's mesh. Nothing is allocated and nothing runs.

Printed per step: compile time; per-device bytes of arguments, outputs, aliased (donated) and XLA's
temporaries, and the peak (arguments + outputs - aliased + temporaries); the train step's FLOPs
from XLA's cost analysis next to andrea_jax/train/mfu.py's count; the tokens/s that 50% MFU would
be; the kernels in the program. The peak excludes cuBLAS / cuDNN workspace and the CUDA context.

Exit 0: every step compiled and fits; 1: a step does not compile, or its peak exceeds the memory
JAX would give it (the target's memory x XLA_PYTHON_CLIENT_MEM_FRACTION, 0.75 unless set); 2: a
bad config or command. Each failure is one line on stderr.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import sys
import time

from andrea_jax.startup import native_stderr_silenced
from andrea_jax.hlo_stats import convert_fusions, kernel_counts, matmul_dtypes

TARGETS = ("h100", "h200", "a100")
GPUS_PER_HOST = 8
DEFAULT_MEM_FRACTION = 0.75  # JAX's preallocation default (XLA_PYTHON_CLIENT_MEM_FRACTION)

def target_config(name: str) -> str:
    """The text of a shipped target description."""
    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r}; known: {', '.join(TARGETS)}")
    return (pathlib.Path(__file__).parent / "targets" / f"{name}.txtpb").read_text()


def _field(text: str, name: str) -> str:
    return re.search(rf"\b{name}:\s*\"?([^\"\n]+)\"?", text).group(1).strip()


def target_memory(name: str) -> int:
    """Bytes of device memory of one GPU of the target."""
    return int(_field(target_config(name), "device_memory_size"))


def target_compute_capability(name: str) -> int:
    """major * 10 + minor of the target (90 for Hopper), as triton counts it."""
    text = target_config(name).split("cuda_compute_capability", 1)[1]
    major, minor = (re.search(rf"\b{f}:\s*(\d+)", text) for f in ("major", "minor"))
    return int(major.group(1)) * 10 + (int(minor.group(1)) if minor else 0)


def target_kind(name: str) -> str:
    """The device_kind jax reports for the target (matched by mfu.peak_flops)."""
    return _field(target_config(name), "device_description_str")


def gpu_devices(target: str, n: int):
    """n devices of the target (GPUS_PER_HOST per host), from the CUDA plugin's topology."""
    from jax.experimental import topologies

    per_host = min(n, GPUS_PER_HOST)
    if n % per_host:
        raise ValueError(f"--devices {n}: more than {GPUS_PER_HOST} GPUs must fill whole hosts of {GPUS_PER_HOST}")
    topology = topologies.get_topology_desc("andrea_aot", "cuda", target_config=target_config(target),
                                            topology=f"1x{n // per_host}x{per_host}")
    return list(topology.devices)


@dataclasses.dataclass
class StepReport:
    step: str
    compile_s: float
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    flops: float | None
    kernels: dict
    convert_fusions: int
    matmuls: dict
    hlo: str = dataclasses.field(repr=False, default="")

    @property
    def peak_bytes(self) -> int:
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    def as_dict(self) -> dict:
        d = {k: v for k, v in dataclasses.asdict(self).items() if k != "hlo"}
        return d | {"peak_bytes": self.peak_bytes}


def _report(step: str, lowered, flops: float | None = None) -> StepReport:
    t0 = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    hlo = compiled.as_text()
    return StepReport(step, compile_s, mem.argument_size_in_bytes, mem.output_size_in_bytes,
                      mem.alias_size_in_bytes, mem.temp_size_in_bytes, flops, kernel_counts(hlo),
                      convert_fusions(hlo), matmul_dtypes(hlo), hlo)


# jax releases whose private APIs this module reads (xla_flops: the lowering's HLO module and the
# cost analysis of jaxlib's client): another release may have moved them.
SUPPORTED_JAX = ((0, 10), (0, 11))


def unsupported_jax() -> str | None:
    """Why the installed jax cannot serve this module, in one line; None when it can."""
    from importlib.metadata import version
    installed = version("jax")
    if tuple(int(p) for p in installed.split(".")[:2]) not in SUPPORTED_JAX:
        known = ", ".join(f"{a}.{b}" for a, b in SUPPORTED_JAX)
        return f"andrea_jax.aot reads private jax APIs known for jax {known}, not the installed jax {installed}"
    return None


def xla_flops(cfg, mesh, state, tokens) -> float | None:
    """FLOPs of one train step (all devices) by XLA's HloCostAnalysis of the lowered program, as
    the kernels' math: the compile-only GPU client has no cost analysis, and the pass counts a
    loop's body once and a custom call (cuDNN attention, a Pallas kernel) as 0, so this lowers the
    same step once more with the layer scan unrolled, one microbatch and kernels.impl=xla,
    model.attention=xla (which computes both halves of the causal scores), and the CPU client's
    pass counts it. Remat's recomputation is in it; mfu.py's count is not."""
    import jax
    from jax._src.lib import _jax

    from andrea_jax.model import transformer
    from andrea_jax.train import steps

    plain = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, attention="xla"),
                                kernels=dataclasses.replace(cfg.kernels, impl="xla"),
                                train=dataclasses.replace(cfg.train, microbatches=1))
    previous = transformer.SCAN_UNROLL
    transformer.SCAN_UNROLL = True
    try:
        lowered = steps.make_train_step(plain, mesh).lower(steps.abstract_state(plain, mesh), tokens)
        module = lowered._lowering.hlo().as_hlo_module()
        cost = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
    except Exception:  # private APIs: the figure is informative, never worth failing for
        return None
    finally:
        transformer.SCAN_UNROLL = previous
    return float(cost["flops"]) if cost and "flops" in cost else None


def compile_steps(cfg, devices, *, eval_step: bool = True, count_flops: bool = True,
                  backend: str = "gpu", compute_capability: int | None = None) -> list[StepReport]:
    """The train step (and the eval step) of cfg, compiled for `devices` (of `backend`), with abstract inputs."""
    import jax
    import numpy as np

    from andrea_jax.kernels import platform
    from andrea_jax.train import sharding, steps

    previous = platform.TARGET_BACKEND
    platform.TARGET_BACKEND = backend  # gpu: Pallas through Triton, cuDNN attention where it applies
    if compute_capability is not None and cfg.kernels.impl == "triton":
        from andrea_jax.kernels import triton_ops  # jax-triton compiles its kernels for this GPU
        triton_ops.COMPUTE_CAPABILITY = compute_capability
    try:
        mesh = steps.make_mesh(cfg, devices)
        state = steps.abstract_state(cfg, mesh)
        tokens = jax.ShapeDtypeStruct((cfg.train.batch_size, cfg.model.seq_len + 1), np.int32,
                                      sharding=steps.batch_sharding(cfg, mesh))
        reports = [_report("train", steps.make_train_step(cfg, mesh).lower(state, tokens),
                           xla_flops(cfg, mesh, state, tokens) if count_flops else None)]
        if eval_step:
            replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            step = jax.ShapeDtypeStruct((), np.int32, sharding=replicated)
            bytes_V = jax.ShapeDtypeStruct((cfg.model.vocab_size,), np.int32, sharding=replicated)
            params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                  state.params, sharding.param_shardings(cfg, mesh))
            reports.append(_report("eval", steps.make_eval_step(cfg, mesh).lower(params, step, tokens, bytes_V)))
        return reports
    finally:
        platform.TARGET_BACKEND = previous


def mem_fraction() -> float:
    return float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", DEFAULT_MEM_FRACTION))


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def describe(cfg, target: str, n_devices: int, reports: list[StepReport]) -> list[str]:
    from andrea_jax.train import mfu as mfu_lib

    memory = target_memory(target)
    usable = memory * mem_fraction()
    kind = target_kind(target)
    tokens = cfg.train.batch_size * cfg.model.seq_len
    model_flops = mfu_lib.model_flops_per_token(cfg.model) * tokens
    peak_flops = mfu_lib.peak_flops(kind) or 0.0
    lines = [f"target {target} ({kind}) x {n_devices}: {gib(memory)} per GPU, {gib(usable)} usable at "
             f"XLA_PYTHON_CLIENT_MEM_FRACTION={mem_fraction():g}"]
    for r in reports:
        lines.append(f"{r.step} step: compiled in {r.compile_s:.1f} s; per device: arguments {gib(r.argument_bytes)}, "
                     f"outputs {gib(r.output_bytes)}, aliased {gib(r.alias_bytes)}, temporaries {gib(r.temp_bytes)}, "
                     f"peak {gib(r.peak_bytes)} ({100 * r.peak_bytes / memory:.1f}% of the GPU)")
        kernels = ", ".join(f"{k} {v}" for k, v in r.kernels.items())
        matmuls = ", ".join(f"{k}: {v}" for k, v in sorted(r.matmuls.items()))
        lines.append(f"{r.step} step kernels: {kernels}; convert-only kernels {r.convert_fusions}; matmuls {matmuls}")
        if r.step == "train":
            xla = "n/a" if r.flops is None else f"{r.flops:.4g}"
            lines.append(f"train step FLOPs: XLA cost analysis {xla}; mfu.py (model, per step) {model_flops:.4g}")
            if peak_flops:
                at_half = 0.5 * peak_flops * n_devices / (model_flops / tokens)
                lines.append(f"50% MFU would be {at_half:,.0f} tokens/s ({at_half / n_devices:,.0f} per GPU; "
                             f"{tokens:,} tokens per step: {tokens / at_half * 1e3:.1f} ms a step)")
    return lines


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
    from andrea_jax import config as config_lib
    from andrea_jax.errors import ConfigError

    try:
        cfg = config_lib.validate(config_lib.override(config_lib.load(args.config), args.set))
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.devices < 1:
        print(f"config error: --devices {args.devices}: need at least 1", file=sys.stderr)
        return 2
    try:
        devices = gpu_devices(args.target, args.devices)
    except (ValueError, NotImplementedError, RuntimeError) as e:
        hint = "" if isinstance(e, ValueError) else " (install the gpu-compile extra: pip install -e '.[gpu-compile]')"
        print(f"error: no {args.target} topology: {' '.join(str(e).split())}{hint}", file=sys.stderr)
        return 1 if not isinstance(e, ValueError) else 2
    try:
        reports = compile_steps(cfg, devices, eval_step=not args.no_eval,
                                compute_capability=target_compute_capability(args.target))
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # XLA's own errors (an unsupported op, a failed ptxas) end in one line
        first = next((l for l in str(e).splitlines() if l.strip()), type(e).__name__)
        print(f"error: {args.config} does not compile for {args.target}: {type(e).__name__}: {first[:400]}",
              file=sys.stderr)
        return 1
    for line in describe(cfg, args.target, args.devices, reports):
        print(line, flush=True)
    if args.dump_hlo:
        os.makedirs(args.dump_hlo, exist_ok=True)
        for r in reports:
            with open(os.path.join(args.dump_hlo, f"{r.step}.hlo"), "w") as f:
                f.write(r.hlo)
    if args.json:
        from andrea_jax.train import sharding
        with open(args.json, "a") as f:
            for r in reports:
                f.write(json.dumps({"target": args.target, "config": args.config, "set": args.set,
                                    "devices": args.devices, "mesh": list(sharding.mesh_shape(cfg.mesh, args.devices)),
                                    **r.as_dict()}) + "\n")
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
