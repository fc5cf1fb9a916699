"""Runs an experiment's training runs as separate processes, `jobs` at a time, resumably.

Each run is `python train.py ...` in its own process (a diverging run cannot take the others
down), started from a frozen copy of the code (RUNS/code) so that edits to the tree while it
trains change nothing. A run leaves RUNS/NAME/result.json with its command and return code; a
rerun skips every run whose result.json holds the same command and an outcome (finished, or
stopped by a non-finite loss: divergence is a result, not a failure to retry).

With `pack` > 1 (`--pack N` of the sweep and the reproduction script, for accelerators), runs that
differ only in settings a population takes train N to a process as the members of one population
(train.py --member, andrea_jax/train/population_loop.py), each still in its own folder with its
own result.json; on a CPU one process per core measures faster (docs/POPULATIONS.md).
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import queue
import shlex
import shutil
import subprocess
import sys
import time
from andrea_jax.errors import ConfigError
from andrea_jax.workdir import Workdir

CODE = ("andrea_jax", "kernels", "configs", "train.py", "pyproject.toml")
PACKAGE_DIRS = {"configs": "configs", "kernels": "kernels/src"}   # pyproject's [tool.setuptools.package-dir]


def snapshot_code(root: pathlib.Path, dest: pathlib.Path, ref: str | None = None) -> None:
    """Copies the code the runs use: the working tree, or the commit `ref` (git archive; git's
    state is only read). SOURCE.txt names where it came from."""
    git = lambda *a: subprocess.run(["git", *a], cwd=root, capture_output=True, text=True)
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if ref:
        archive = subprocess.run(["git", "archive", ref, *CODE], cwd=root, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
        source = f"git archive {ref} ({git('rev-parse', ref).stdout.strip()})\n"
    else:
        for name in CODE:
            src = root / name
            if src.is_dir():
                shutil.copytree(src, tmp / name, ignore=shutil.ignore_patterns("__pycache__"))
            elif src.is_file():
                shutil.copy2(src, tmp / name)
        head, changes = git("rev-parse", "HEAD").stdout.strip(), git("status", "--short").stdout
        source = f"working tree at commit {head}\n{changes}"
    # pyproject maps andrea_jax.configs and andrea_jax.kernels onto configs/ and kernels/src/; an
    # editable install resolves them in the live tree through a finder that comes after the path
    # one, so the copy holds them where the path finder looks first, inside its own andrea_jax.
    for package, folder in PACKAGE_DIRS.items():
        shutil.copytree(tmp / folder, tmp / "andrea_jax" / package, ignore=shutil.ignore_patterns("__pycache__"),
                        dirs_exist_ok=True)
    (tmp / "SOURCE.txt").write_text(source)
    tmp.rename(dest)


def train_command(config: str, workdir: pathlib.Path, sets) -> list:
    return [sys.executable, "train.py", "--config", config, "--workdir", str(workdir),
            *[a for s in sets for a in ("--set", s)]]


def outcome(workdir: pathlib.Path, command: list) -> str | None:
    """'finished' or 'diverged' for a run done with this command; None: to train (not run, run
    with another command, or failed for another reason, which a rerun retries)."""
    result_path = workdir / "result.json"
    if not result_path.is_file():
        return None
    result = json.loads(result_path.read_text())
    if result.get("command") != shlex.join(command[1:]):
        return None
    return result.get("outcome") if result.get("outcome") in ("finished", "diverged") else None


def _classify(workdir: pathlib.Path, returncode: int, steps: int) -> str:
    metrics = Workdir(workdir).metrics
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    last = json.loads(lines[-1]) if lines else {}
    if last.get("frozen"):  # a population's member that met a non-finite loss (andrea_jax.train.population)
        return "diverged"
    if returncode == 0 and last.get("step") == steps and "val_loss" in last:
        return "finished"
    log = (workdir / "train.log").read_text()[-3000:] if (workdir / "train.log").is_file() else ""
    return "diverged" if "non-finite" in log else "failed"


def _python_path(code: pathlib.Path) -> str:
    """The frozen code first, then what the caller's PYTHONPATH holds (packages installed beside
    the interpreter's, as the GPU machine's carried wheels are)."""
    return os.pathsep.join(p for p in (str(code), os.environ.get("PYTHONPATH", "")) if p)


COMMAND = "command.txt"  # a run's command, written when it starts: what a resumed run must match


def _same_command(workdir: pathlib.Path, command: list) -> bool:
    return (workdir / COMMAND).is_file() and (workdir / COMMAND).read_text() == shlex.join(command[1:])


def _ready(workdir: pathlib.Path, command: list, resume: bool) -> None:
    """A stopped or outdated run's folder is emptied; with `resume`, a stopped run of the same command is kept."""
    if workdir.exists() and not (resume and _same_command(workdir, command)):
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / COMMAND).write_text(shlex.join(command[1:]))


def _timed(command: list, code: pathlib.Path, log_path: pathlib.Path, resume: bool, env: dict | None) -> dict:
    """Runs `command` from the code snapshot, its output into log_path: its return code, and where and
    when it ran (which GPUs it held, and the wall-clock span they were held)."""
    start, started = time.perf_counter(), time.time()
    with log_path.open("a" if resume else "w") as log:
        rc = subprocess.run(command, cwd=code, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": _python_path(code), **(env or {})}).returncode
    return {"returncode": rc, "seconds": time.perf_counter() - start,
            "devices": (env or {}).get("CUDA_VISIBLE_DEVICES"), "started": started, "ended": time.time()}


def _record(command: list, workdir: pathlib.Path, steps: int, ran: dict, **extra) -> dict:
    result = {"command": shlex.join(command[1:]), "returncode": ran["returncode"], "seconds": ran["seconds"],
              "outcome": _classify(workdir, ran["returncode"], steps),
              **{k: ran[k] for k in ("devices", "started", "ended")}, **extra}
    (workdir / "result.json").write_text(json.dumps(result, indent=1))
    return result


def train_one(command: list, workdir: pathlib.Path, code: pathlib.Path, steps: int, *, resume: bool = False,
              env: dict | None = None) -> dict:
    """Trains one run in its own process. A stopped or outdated run restarts from scratch, or,
    with `resume`, a stopped run of the same command continues from its newest checkpoint
    (train.py resumes by itself); env: extra environment (e.g. CUDA_VISIBLE_DEVICES)."""
    _ready(workdir, command, resume)
    return _record(command, workdir, steps, _timed(command, code, workdir / "train.log", resume, env))


def command_parts(command: list) -> tuple[str, list[str]]:
    """(--config, the --set values) of a train_command."""
    config = command[command.index("--config") + 1]
    return config, [command[i + 1] for i, a in enumerate(command) if a == "--set"]


def pack_command(runs: dict, names: list[str]) -> list:
    """train.py's command that trains the runs `names` of {name: (command, workdir, steps)} as one
    population: --workdir their folders' common parent, each run a --member with its folder's path
    under it and its own --set values."""
    root = pathlib.Path(os.path.commonpath([runs[n][1] for n in names]))
    members = [a for n in names for a in ("--member", str(runs[n][1].relative_to(root)), *command_parts(runs[n][0])[1])]
    return [sys.executable, "train.py", "--config", command_parts(runs[names[0]][0])[0], "--workdir", str(root),
            *members]


def packs(runs: dict, n: int, *, resume: bool = False) -> list[list[str]]:
    """The runs of {name: (command, workdir, steps)} in packs of at most n that one population
    process trains (andrea_jax.train.population): the same --config and settings but for
    population.PER_MEMBER's, one data order, and with `resume` the same newest checkpoint of the
    same command; first fit, in the runs' order. ConfigError names a run no population can train."""
    from andrea_jax import config as config_lib, configs
    from andrea_jax.train import population

    def fits(cfgs) -> bool:
        try:
            population.check_structure(cfgs)
        except ConfigError:
            return False
        return True

    made = []  # (key, names, configs)
    for name, (command, workdir, _) in runs.items():
        config, sets = command_parts(command)
        cfg = config_lib.validate(config_lib.override(configs.load(config), sets))
        try:
            population.check_structure([cfg])
        except ConfigError as e:
            raise ConfigError(f"--pack: run {name} cannot be trained in a population ({e}); "
                              "train it without --pack") from None
        at = Workdir(workdir).checkpoint_steps() if resume and _same_command(workdir, command) else []
        key = (config, at[-1] if at else 0)
        pack = next((p for p in made if p[0] == key and len(p[1]) < n and fits([*p[2], cfg])), None)
        if pack is None:
            made.append((key, [name], [cfg]))
        else:
            pack[1].append(name)
            pack[2].append(cfg)
    return [names for _, names, _ in made]


def train_pack(names: list[str], runs: dict, code: pathlib.Path, *, resume: bool = False,
               env: dict | None = None) -> dict[str, dict]:
    """Trains the runs `names` of {name: (command, workdir, steps)} in one population process
    (pack_command). Each member's folder is left as train_one leaves a run's: its own command in
    COMMAND and result.json (so a rerun, with --pack or without, finds it done or resumes it), and
    the process's output as its train.log; result.json names the pack."""
    for name in names:
        _ready(runs[name][1], runs[name][0], resume)
    first = runs[names[0]][1] / "train.log"
    offset = first.stat().st_size if resume and first.is_file() else 0
    ran = _timed(pack_command(runs, names), code, first, resume, env)
    output = first.read_bytes()[offset:]
    results = {}
    for name in names:
        command, workdir, steps = runs[name]
        if name != names[0]:
            with (workdir / "train.log").open("ab" if resume else "wb") as log:
                log.write(output)
        results[name] = _record(command, workdir, steps, ran, pack=names)
    return results


def plan(exp, runs_dir: pathlib.Path, seeds=None, arms=None, extra=()) -> dict:
    """{ARM_sSEED: (command, workdir, steps)} of one experiment (default: all its seeds and arms),
    seeds outermost: a stopped invocation leaves whole seeds. The reproduction script and the
    sweep runner both plan with this, so either finds the other's runs done."""
    from andrea_jax.repro import experiments
    runs = {}
    for seed in exp.seeds if seeds is None else seeds:
        for arm in exp.arms if arms is None else arms:
            sets, workdir = experiments.run_sets(exp, arm, seed, extra), runs_dir / f"{arm}_s{seed}"
            runs[f"{arm}_s{seed}"] = (train_command(exp.config, workdir, sets), workdir, steps_of(sets))
    return runs


def precheck_plan(exp, runs_dir: pathlib.Path, extra=()) -> dict:
    """The precheck's runs: the first two arms, seed 0, for exp.precheck_steps, in RUNS/EXPERIMENT/precheck."""
    return plan(exp, runs_dir / "precheck", [0], list(exp.arms)[:2], [*extra, *exp.precheck_sets])


def precheck(exp, runs_dir: pathlib.Path, code: pathlib.Path, extra, jobs: int, log=print) -> float:
    """Trains precheck_plan's runs and logs block 1's gradient norm over block L's (the report
    quotes it too). Returns the seconds spent."""
    from andrea_jax.repro import summarize
    runs = precheck_plan(exp, runs_dir, extra)
    seconds = run_all(runs, code, jobs, log)
    for name, (_, workdir, _) in runs.items():
        steps, ratio = summarize.grad_ratio_curve(workdir)
        log(f"precheck {name}: |grad block 1| / |grad block L| by step: " +
            ", ".join(f"{s}: {r:.2g}" for s, r in zip(steps, ratio)))
    return seconds


def steps_of(sets) -> int:
    """train.steps as the last override that sets it gives it."""
    return int([s for s in sets if s.startswith("train.steps=")][-1].split("=", 1)[1])


def run_all(runs: dict, code: pathlib.Path, jobs: int, log=print, *, resume: bool = False,
            device_sets: list[str] | None = None, pack: int = 1) -> float:
    """Trains every run of {name: (command, workdir, steps)} that has no outcome yet, `jobs` at a
    time, in the order given (`resume`: see train_one). device_sets: one CUDA_VISIBLE_DEVICES
    value per concurrent slot (then jobs = len(device_sets)); each run holds one while it trains.
    pack > 1: up to `pack` runs that can be trained together (`packs`) train in one population
    process, which holds one slot (for accelerators; on a CPU one process per core is faster).
    Returns the wall-clock seconds spent."""
    todo = [n for n, (cmd, wd, _) in runs.items() if outcome(wd, cmd) is None]
    jobs = len(device_sets) if device_sets else jobs
    units = packs({n: runs[n] for n in todo}, pack, resume=resume) if pack > 1 else [[n] for n in todo]
    log(f"{len(runs) - len(todo)} of {len(runs)} runs already done; training {len(todo)}, {jobs} at a time"
        + (f", in {len(units)} processes of up to {pack} runs (--pack)" if pack > 1 else ""))
    if not todo:
        return 0.0  # no wall time spent training: the reports' wall time stays as it was
    free = queue.Queue()
    for devices in device_sets or [None] * max(1, jobs):
        free.put(devices)

    def on_a_slot(unit: list[str]) -> dict[str, dict]:
        devices = free.get()
        try:
            env = None if devices is None else {"CUDA_VISIBLE_DEVICES": devices}
            if len(unit) > 1:
                return train_pack(unit, runs, code, resume=resume, env=env)
            command, workdir, steps = runs[unit[0]]
            return {unit[0]: train_one(command, workdir, code, steps, resume=resume, env=env)}
        finally:
            free.put(devices)

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        for future in concurrent.futures.as_completed([pool.submit(on_a_slot, unit) for unit in units]):
            for name, r in future.result().items():
                log(f"{time.strftime('%H:%M:%S')} {name}: {r['outcome']} (rc {r['returncode']}), "
                    f"{r['seconds'] / 60:.1f} min")
    return time.perf_counter() - start
