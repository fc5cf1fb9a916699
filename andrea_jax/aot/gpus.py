"""The GPUs andrea_jax.aot compiles for: their descriptions (targets/NAME.txtpb, XLA:GPU's
GpuTargetConfig in text form) and the devices of the CUDA plugin's topology for N of them."""
from __future__ import annotations

import pathlib
import re

TARGETS = ("h100", "h200", "a100")
GPUS_PER_HOST = 8


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
