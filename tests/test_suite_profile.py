"""benchmarks/suite.py on a toy suite of two tests, one compiling in its worker and one in a process it
starts: the report puts each compile on its side, tells a compile from a persistent-cache hit (a first
run into a new TMPDIR compiles, the same run again is served by the cache), and charges the started
process's CPU to the test that started it, and lists the started programs with their CPU."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

TOY_CONFTEST = '''
import os, tempfile
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), "toy_xla_cache")
os.environ["JAX_PLATFORMS"] = "cpu"
'''
TOY_TESTS = '''
import subprocess, sys
import jax, jax.numpy as jnp

def test_compiles_here():
    assert float(jax.jit(lambda x: x * 2 + 1)(jnp.float32(3))) == 7.0

def test_starts_a_process():
    code = "import jax, jax.numpy as jnp; print(float(jax.jit(lambda x: x - 1)(jnp.float32(3))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[-1] == "2.0"
'''


def table_row(out: str, first_cell: str) -> list[str]:
    (row,) = [line for line in out.splitlines() if line.startswith(f"| {first_cell} |")]
    return [cell.strip() for cell in row.strip("|").split("|")]


def profile(toy: pathlib.Path, tmp: pathlib.Path) -> str:
    # --rootdir: else pytest roots the toy at the common ancestor of the checkout and tmp_path, and its test ids
    # would carry the path between
    command = [sys.executable, str(ROOT / "benchmarks" / "suite.py"), "--tmpdir", str(tmp), "--workers", "1", "--",
               f"--rootdir={toy}", str(toy)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 passed" in proc.stdout, proc.stdout
    return proc.stdout


def test_the_suite_profile_splits_compiles_by_process_and_tells_cache_hits(tmp_path):
    toy = tmp_path / "toy_tests"
    toy.mkdir()
    (toy / "conftest.py").write_text(TOY_CONFTEST)
    (toy / "test_toy.py").write_text(TOY_TESTS)

    cold = profile(toy, tmp_path / "run")
    # columns: event, workers s, workers count, started processes s, started count
    compiled, cached = table_row(cold, "backend compile"), table_row(cold, "backend compile served by the cache")
    # the started process may find a program of the worker's in the cache (jnp.float32's conversion)
    assert int(compiled[2]) >= 1 and int(compiled[4]) >= 1 and cached[2] == "0", cold
    assert int(table_row(cold, "trace")[2]) >= 1 and int(table_row(cold, "trace")[4]) >= 1, cold
    here, started = (table_row(cold, f"test_toy.py::{name}") for name in
                     ("test_compiles_here", "test_starts_a_process"))
    assert float(here[3]) == 0 and float(started[3]) > 0, cold   # CPU in started processes
    assert "worker gw0: 2 tests" in cold, cold
    program = table_row(cold, "-c")   # the started `python -c`: one process, its CPU before its first trace
    assert program[1] == "1" and 0 < float(program[3]) <= float(program[2]), cold

    warm = profile(toy, tmp_path / "run")   # the same TMPDIR: its XLA cache serves every compile
    compiled, cached = table_row(warm, "backend compile"), table_row(warm, "backend compile served by the cache")
    assert compiled[2] == compiled[4] == "0" and int(cached[2]) >= 1 and int(cached[4]) >= 1, warm
