"""Sharded kernels equal unsharded ones on 8 CPU devices (tests/programs/kernels_sharded.py).

The check runs in a subprocess because the device count is fixed when jax starts, and the rest of
the suite runs with one device.
"""
from __future__ import annotations

import pathlib
import subprocess
import sys

from _devices import cpu_devices_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "programs" / "kernels_sharded.py"
CASES = [f"OK {mesh} {op}" for mesh in ("explicit data x seq", "auto data (set_mesh)")
         for op in ("residual_layer_norm", "layer_norm", "bias_gelu")]


def test_sharded_kernels_equal_unsharded_on_8_cpu_devices():
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=cpu_devices_env(8), capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
    for case in CASES + ["OK control", "OK model tiny pallas sharded == xla unsharded", "ALL OK"]:
        assert case in proc.stdout, f"missing {case!r} in:\n{proc.stdout}"
