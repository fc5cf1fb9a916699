"""Imported by every Python process of a profiled suite (benchmarks/suite.py puts this folder on
PYTHONPATH): once jax's monitoring module loads, each trace, lowering and backend compile (with the
persistent cache's hits) is appended to $ANDREA_SUITE_LOG, with the pid and the test that was running
when the process started or is running now; and, when the process exits, its own CPU seconds, those it
had spent before its first trace (starting Python, imports, reading its input), and its program.
Without ANDREA_SUITE_LOG it does nothing. It shadows any other sitecustomize on the path, for the length
of the profiled run only."""
import atexit
import importlib.abc
import importlib.machinery
import os
import sys

_LOG = os.environ.get("ANDREA_SUITE_LOG")
_EVENTS = ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration", "backend_compile_duration")


def _write(kind: str, seconds: float, name: str = "-") -> None:
    test = os.environ.get("PYTEST_CURRENT_TEST", "-").rsplit(" ", 1)[0]
    with open(_LOG, "a") as f:  # one short line per write: appends from many processes stay whole
        f.write(f"{os.getpid()}\t{test}\t{kind}\t{seconds:.4f}\t{name}\n")


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


_BEFORE_FIRST_TRACE: list[float] = []


def _on_exit() -> None:
    program = sys.argv[0] if sys.argv and sys.argv[0] else "-"
    before = _BEFORE_FIRST_TRACE[0] if _BEFORE_FIRST_TRACE else _cpu()
    _write("exit", _cpu(), f"{before:.3f} {program}")


def _listen(monitoring) -> None:
    def on_duration(event: str, duration: float, **kwargs) -> None:
        kind = event.rsplit("/", 1)[-1]
        if kind == "jaxpr_trace_duration" and not _BEFORE_FIRST_TRACE:
            _BEFORE_FIRST_TRACE.append(_cpu() - duration)
        if kind in _EVENTS:
            _write(kind, duration, kwargs.get("fun_name", "-"))

    def on_event(event: str, **kwargs) -> None:
        if event.endswith("/cache_hits"):  # comes just before the compile it saved, in the same process
            _write("cache_hit", 0.0)
    monitoring.register_event_duration_secs_listener(on_duration)
    monitoring.register_event_listener(on_event)


class _OnMonitoringImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "jax._src.monitoring":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _listen(module)
        spec.loader.exec_module = exec_module
        return spec


if _LOG:
    sys.meta_path.insert(0, _OnMonitoringImport())
    atexit.register(_on_exit)
