"""A pytest plugin of benchmarks/suite.py: one line per test in $ANDREA_SUITE_TIMELINE with the xdist
worker, the worker's pid, the wall-clock start and end, and the CPU seconds the test took in the worker
and in the processes it started and waited for."""
import os
import resource
import time

import pytest

_OUT = os.environ.get("ANDREA_SUITE_TIMELINE")


def _cpu_seconds() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start, (own, children) = time.time(), _cpu_seconds()
    yield
    end, (own_end, children_end) = time.time(), _cpu_seconds()
    if _OUT:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(_OUT, "a") as f:
            f.write(f"{worker}\t{os.getpid()}\t{item.nodeid}\t{start:.3f}\t{end:.3f}\t{own_end - own:.3f}\t"
                    f"{children_end - children:.3f}\n")
