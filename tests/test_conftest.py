"""The suite's own machinery: a test marked compiled_at_o1 runs at -O1 where the suite compiles at -O0,
and its outcome there is the suite's."""
import os
import pathlib
import shutil
import subprocess
import sys

TESTS = pathlib.Path(__file__).resolve().parent

MARKED = '''
import os
import pytest

@pytest.mark.compiled_at_o1
def test_sees_o1():
    assert "--xla_backend_optimization_level=1" in os.environ["XLA_FLAGS"].split()

@pytest.mark.compiled_at_o1
def test_fails_at_o1():
    assert False, "a failure at -O1"

def test_unmarked_sees_o0():
    assert "--xla_backend_optimization_level=0" in os.environ["XLA_FLAGS"].split()
'''


def test_a_marked_test_runs_at_o1_in_a_pytest_of_its_own_and_its_failure_fails_the_suite(tmp_path):
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_marked.py").write_text(MARKED)
    outer = ("PYTEST_XDIST", "PYTEST_CURRENT", "ANDREA_TESTS_O1")
    env = {k: v for k, v in os.environ.items() if not k.startswith(outer)}
    env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_marked.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "1 failed, 2 passed" in proc.stdout, proc.stdout + proc.stderr
    assert "FAILED test_marked.py::test_fails_at_o1" in proc.stdout
    assert "at -O1, in a pytest of its own" in proc.stdout and "a failure at -O1" in proc.stdout
