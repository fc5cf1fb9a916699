"""Where the test suite's time goes on this machine, on a first run or a later one.

    python benchmarks/suite.py                        # pytest -n 2 tests, cold: a new TMPDIR, so an empty XLA cache
    python benchmarks/suite.py --tmpdir /tmp/suite    # cold the first time; again with the same folder: warm
    python benchmarks/suite.py --workers 1 -- tests/test_model.py -k scan    # pytest's arguments after --

Runs pytest as the README's second command does, in the checkout, with TMPDIR set to --tmpdir (the suite
keeps its XLA cache there, tests/conftest.py) and two hooks on PYTHONPATH (benchmarks/suite_hooks/): a
pytest plugin that records each test's wall time and its CPU seconds in the worker and in the processes
the test started, and a sitecustomize that records every jax trace, lowering and backend compile of every
Python process of the run. Prints pytest's summary line, then:
- the wall time and the CPU seconds of the whole run, and how many cores they kept busy on average;
- each worker's busy time and how long it stood idle at the end;
- the CPU split between the pytest workers and the processes the tests start;
- the jax compile events of each side: trace, lowering, backend compiles that compiled and those the
  persistent cache served;
- the tests and the files that took the most CPU.
The logs stay in --tmpdir/suite_profile. Exits with pytest's status.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import pathlib
import re
import resource
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
HOOKS = ROOT / "benchmarks" / "suite_hooks"
# Set by a surrounding pytest or an earlier run: each would point this run at another run's caches.
INHERITED = ("PYTEST_XDIST", "PYTEST_CURRENT", "JAX_COMPILATION_CACHE_DIR", "ANDREA_GPU_KERNEL_CACHE",
             "ANDREA_TESTS_O1_PROCESS", "ANDREA_SUITE_")
EVENTS = {"jaxpr_trace_duration": "trace", "jaxpr_to_mlir_module_duration": "lower to MLIR",
          "compiled": "backend compile", "cached": "backend compile served by the cache"}


@dataclasses.dataclass(frozen=True)
class Test:
    worker: str
    pid: str
    name: str
    start: float
    end: float
    own_cpu: float
    child_cpu: float


def read_timeline(path: pathlib.Path) -> list[Test]:
    rows = [line.split("\t") for line in path.read_text().splitlines()] if path.is_file() else []
    return [Test(w, pid, name, float(a), float(b), float(own), float(kids)) for w, pid, name, a, b, own, kids in rows]


def read_compiles(path: pathlib.Path, worker_pids: set[str]) -> dict[tuple[str, str], list[float]]:
    """(side, event) -> [seconds, count], side 'workers' or 'started'. A backend compile that follows a
    cache hit in the same process is 'cached', else 'compiled'."""
    totals: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0])
    hit_pending: set[str] = set()
    for line in path.read_text().splitlines() if path.is_file() else []:
        pid, _test, kind, seconds, _name = line.split("\t")
        if kind == "exit":
            continue
        if kind == "cache_hit":
            hit_pending.add(pid)
            continue
        if kind == "backend_compile_duration":
            kind = "cached" if pid in hit_pending else "compiled"
            hit_pending.discard(pid)
        entry = totals[("workers" if pid in worker_pids else "started", kind)]
        entry[0] += float(seconds)
        entry[1] += 1
    return totals


def read_exits(path: pathlib.Path, worker_pids: set[str]) -> dict[str, list[float]]:
    """program -> [processes, CPU s, CPU s before the first trace] of the processes the tests started
    that exited normally (a killed one leaves no record), the program relative to the checkout."""
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for line in path.read_text().splitlines() if path.is_file() else []:
        pid, _test, kind, seconds, name = line.split("\t")
        if kind != "exit" or pid in worker_pids:
            continue
        before, _, program = name.partition(" ")
        program = pathlib.Path(program)
        program = program.relative_to(ROOT) if program.is_relative_to(ROOT) else program.name
        entry = totals[str(program)]
        entry[0] += 1
        entry[1] += float(seconds)
        entry[2] += float(before)
    return totals


def report(tests: list[Test], compiles: dict, wall: float, user: float, system: float, top: int,
           exits: dict | None = None) -> str:
    cpu = user + system
    lines = [f"wall {wall:.0f} s; CPU {cpu:.0f} s (user {user:.0f}, system {system:.0f}): "
             f"{cpu / wall:.2f} of {os.cpu_count()} cores busy on average", ""]
    if not tests:
        return "\n".join(lines + ["no test ran"])
    first, last = min(t.start for t in tests), max(t.end for t in tests)
    by_worker: dict[str, list[Test]] = collections.defaultdict(list)
    for t in tests:
        by_worker[t.worker].append(t)
    for worker, mine in sorted(by_worker.items()):
        busy = sum(t.end - t.start for t in mine)
        lines.append(f"worker {worker}: {len(mine)} tests, busy {busy:.0f} s, idle for the last "
                     f"{last - max(t.end for t in mine):.0f} s of {last - first:.0f}")
    own, started = sum(t.own_cpu for t in tests), sum(t.child_cpu for t in tests)
    lines += ["", f"CPU in the pytest workers {own:.0f} s; in the processes the tests started {started:.0f} s", "",
              "| jax compile event | workers: CPU s | count | started processes: CPU s | count |",
              "|---|---|---|---|---|"]
    for kind, label in EVENTS.items():
        (ws, wn), (ss, sn) = compiles.get(("workers", kind), (0.0, 0)), compiles.get(("started", kind), (0.0, 0))
        lines.append(f"| {label} | {ws:.0f} | {wn} | {ss:.0f} | {sn} |")
    if exits:
        lines += ["", "| program the tests started | processes | CPU s | of it before the first trace |",
                  "|---|---|---|---|"]
        for program, (n, cpu_s, before_s) in sorted(exits.items(), key=lambda kv: -kv[1][1])[:top]:
            lines.append(f"| {program} | {n} | {cpu_s:.1f} | {before_s:.1f} |")
    lines += ["", f"| test (the {top} that took the most CPU) | wall s | CPU s | in started processes |",
              "|---|---|---|---|"]
    for t in sorted(tests, key=lambda t: -(t.own_cpu + t.child_cpu))[:top]:
        lines.append(f"| {t.name} | {t.end - t.start:.1f} | {t.own_cpu + t.child_cpu:.1f} | {t.child_cpu:.1f} |")
    by_file: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for t in tests:
        entry = by_file[t.name.split("::")[0]]
        entry[0] += t.own_cpu + t.child_cpu
        entry[1] += t.end - t.start
        entry[2] += 1
    lines += ["", f"| file (the {top} that took the most CPU) | tests | wall s | CPU s |", "|---|---|---|---|"]
    for name, (file_cpu, file_wall, n) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"| {name} | {n} | {file_wall:.0f} | {file_cpu:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tmpdir", help="TMPDIR of the run, where the suite keeps its XLA cache "
                                         "(default: a new folder, so the run is cold)")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (-n)")
    parser.add_argument("--top", type=int, default=25, help="how many tests and files to list")
    parser.add_argument("pytest_args", nargs="*", default=["tests"], help="after --: pytest's arguments")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers {args.workers}: give 1 or more")
    tmp = pathlib.Path(args.tmpdir) if args.tmpdir else pathlib.Path(tempfile.mkdtemp(prefix="andrea_suite_"))
    logs = tmp / "suite_profile"
    logs.mkdir(parents=True, exist_ok=True)
    timeline, compile_log, pytest_log = logs / "timeline.tsv", logs / "compiles.tsv", logs / "pytest.log"
    for old in (timeline, compile_log, pytest_log):
        old.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(INHERITED)}
    env.update(TMPDIR=str(tmp), ANDREA_SUITE_LOG=str(compile_log), ANDREA_SUITE_TIMELINE=str(timeline),
               PYTHONPATH=os.pathsep.join(p for p in (str(HOOKS), env.get("PYTHONPATH", "")) if p))
    command = [sys.executable, "-m", "pytest", "-p", "suite_timeline", "-n", str(args.workers), *args.pytest_args]
    print(f"TMPDIR={tmp} {' '.join(command[1:])}", flush=True)
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    proc = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall, after = time.monotonic() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    pytest_log.write_text(proc.stdout)
    summary = [line for line in proc.stdout.splitlines() if re.search(r" in [\d.]+s( \(.*\))? =*$", line)]
    print(summary[-1] if summary else proc.stdout[-3000:])
    tests = read_timeline(timeline)
    worker_pids = {t.pid for t in tests}
    compiles, exits = read_compiles(compile_log, worker_pids), read_exits(compile_log, worker_pids)
    print(report(tests, compiles, wall, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime, args.top,
                 exits))
    print(f"\nlogs: {logs}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
