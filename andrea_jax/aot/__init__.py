"""Compiling the train and eval steps for a GPU that is not attached (`python -m andrea_jax.aot`,
`andrea-aot`; the command is in __main__.py): gpus.py (the targets and their devices), compile.py
(the steps compiled, a StepReport each), hlo_stats.py (what the compiled HLO holds).

Importing this package imports no jax: the command starts jax itself, after JAX_PLATFORMS is set.
"""
from andrea_jax.aot.compile import KERNEL_CACHE, StepReport, compile_steps, unsupported_jax, xla_flops
from andrea_jax.aot.gpus import (GPUS_PER_HOST, TARGETS, gpu_devices, target_compute_capability, target_config,
                                 target_kind, target_memory)

__all__ = ["KERNEL_CACHE", "StepReport", "compile_steps", "unsupported_jax", "xla_flops", "GPUS_PER_HOST", "TARGETS",
           "gpu_devices", "target_compute_capability", "target_config", "target_kind", "target_memory"]
