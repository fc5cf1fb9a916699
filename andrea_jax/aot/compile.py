"""The train and eval steps of a config compiled for given devices with abstract inputs, and what
XLA made of them (StepReport: memory, FLOPs, kernels, matmul dtypes)."""
from __future__ import annotations

import dataclasses
import os
import re
import time

from andrea_jax.aot.hlo_stats import convert_fusions, cudnn_attention_operands, kernel_counts, matmul_dtypes


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
    attention_calls: dict = dataclasses.field(default_factory=dict)  # hlo_stats.cudnn_attention_operands
    hlo: str = dataclasses.field(repr=False, default="")

    @property
    def peak_bytes(self) -> int:
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    def as_dict(self) -> dict:
        d = {k: v for k, v in dataclasses.asdict(self).items() if k != "hlo"}
        return d | {"peak_bytes": self.peak_bytes}


# A folder where GPU compiles keep the kernels XLA:GPU compiled (ptxas is most of a deviceless compile's
# time), one file per device kind, for the next compile of the same kernels here or in another process.
KERNEL_CACHE = "ANDREA_GPU_KERNEL_CACHE"


def kernel_cache_options(backend: str, devices) -> dict:
    """The compile options that point XLA:GPU at $ANDREA_GPU_KERNEL_CACHE's file for these devices' kind
    (a cubin serves one architecture); none for the CPU or without the variable. XLA reuses a kernel
    only for the same fused computation and arguments, so the compiled program does not change."""
    folder = os.environ.get(KERNEL_CACHE)
    if backend != "gpu" or not folder:
        return {}
    os.makedirs(folder, exist_ok=True)
    kind = re.sub(r"[^a-z0-9]+", "_", devices[0].device_kind.lower()).strip("_")
    return {"xla_gpu_kernel_cache_file": os.path.join(folder, f"{kind}.bin")}


def _report(step: str, lowered, flops: float | None = None, options: dict | None = None) -> StepReport:
    t0 = time.perf_counter()
    compiled = lowered.compile(compiler_options=options or None)
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    hlo = compiled.as_text()
    return StepReport(step, compile_s, mem.argument_size_in_bytes, mem.output_size_in_bytes,
                      mem.alias_size_in_bytes, mem.temp_size_in_bytes, flops, kernel_counts(hlo),
                      convert_fusions(hlo), matmul_dtypes(hlo), cudnn_attention_operands(hlo), hlo)


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

    from andrea_jax.train import steps

    plain = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, attention="xla"),
                                kernels=dataclasses.replace(cfg.kernels, impl="xla"),
                                train=dataclasses.replace(cfg.train, microbatches=1))
    try:
        step = steps.make_train_step(plain, mesh, scan_unroll=True)
        lowered = step.lower(steps.abstract_state(plain, mesh), tokens)
        module = lowered._lowering.hlo().as_hlo_module()
        cost = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
    except Exception:  # private APIs: the figure is informative, never worth failing for
        return None
    return float(cost["flops"]) if cost and "flops" in cost else None


def compile_steps(cfg, devices, *, eval_step: bool = True, count_flops: bool = True,
                  backend: str = "gpu", compute_capability: int | None = None, population: int = 0) -> list[StepReport]:
    """The train step (and the eval step) of cfg, compiled for `devices` (of `backend`), with abstract inputs.
    population N > 0: the train step of a population of N members of cfg (andrea_jax.train.population,
    one vmapped step), alone: its members evaluate with the solo eval step, and XLA's FLOPs are not counted."""
    import jax
    import numpy as np

    from andrea_jax.kernels import platform
    from andrea_jax.train import population as population_lib, sharding, steps

    # gpu: Pallas through Triton, cuDNN attention where it applies, jax-triton's kernels for the
    # capability; the caller's target is back afterwards
    options = kernel_cache_options(backend, devices)
    with platform.target(backend, compute_capability):
        mesh = steps.make_mesh(cfg, devices)
        state = steps.abstract_state(cfg, mesh)
        tokens = jax.ShapeDtypeStruct((cfg.train.batch_size, cfg.model.seq_len + 1), np.int32,
                                      sharding=steps.batch_sharding(cfg, mesh))
        if population:
            members = [cfg] * population
            lowered = population_lib.make_train_step(members, mesh).lower(
                population_lib.abstract_state(members, mesh), tokens)
            return [_report("train", lowered, options=options)]
        reports = [_report("train", steps.make_train_step(cfg, mesh).lower(state, tokens),
                           xla_flops(cfg, mesh, state, tokens) if count_flops else None, options)]
        if eval_step:
            replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            step = jax.ShapeDtypeStruct((), np.int32, sharding=replicated)
            bytes_V = jax.ShapeDtypeStruct((cfg.model.vocab_size,), np.int32, sharding=replicated)
            params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                  state.params, sharding.param_shardings(cfg, mesh))
            reports.append(_report("eval", steps.make_eval_step(cfg, mesh).lower(params, step, tokens, bytes_V),
                                   options=options))
        return reports
