"""A sweep's frozen copy of the code (andrea_jax/repro/runner.py, snapshot_code) is what its runs
import: every package of andrea_jax, those pyproject maps onto other folders included, resolves
inside the copy even where an editable install points them at the live tree."""
import os
import pathlib
import subprocess
import sys
import tomllib

from andrea_jax.repro import runner

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_copy_holds_every_package_pyproject_maps_elsewhere():
    mapped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert {f"andrea_jax.{p}": f for p, f in runner.PACKAGE_DIRS.items()} == mapped


def test_a_run_started_in_the_copy_imports_the_copy_not_the_live_tree(tmp_path):
    code = tmp_path / "code"
    runner.snapshot_code(ROOT, code)
    probe = ("import andrea_jax, andrea_jax.configs, andrea_jax.kernels, andrea_jax.kernels.platform as p\n"
             "print(andrea_jax.__file__); print(andrea_jax.configs.__file__); print(p.__file__)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=code, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": runner._python_path(code)}).stdout.split()
    assert len(out) == 3 and all(pathlib.Path(f).is_relative_to(code) for f in out), out
