"""The environment of a subprocess that runs jax on n CPU devices."""
import os

DEVICE_COUNT = "--xla_force_host_platform_device_count"


def cpu_devices_env(n: int) -> dict:
    """os.environ with n CPU devices; the caller's other XLA flags (an instruction-set cap such as
    --xla_cpu_max_isa=AVX2, say) reach the subprocess too."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT)]
    return {**os.environ, "XLA_FLAGS": " ".join([*flags, f"{DEVICE_COUNT}={n}"]), "JAX_PLATFORMS": "cpu"}
