"""Sweeps over any grid of settings: `python -m andrea_jax.repro.sweep SPEC.py [--jobs N | --gpus-per-run K]
[--slurm] [--report]`.

SPEC.py defines `SWEEP = Sweep(...)`: the base config, the axes (each a setting and its values;
the grid is their product), the seeds, and the paired baseline, a value of some of the axes
(e.g. {"prores.schedule": "none"}). Runs are grouped by the values of the other axes; within a
group every arm is compared with the baseline arm of the same seed. Each run is `train.py` in its
own process, started from a frozen copy of the code (RUNS/code), in RUNS/GROUP/ARM_sSEED.

- Local: `--jobs N` runs at a time on the CPU, or with `--gpus-per-run K` one run per K GPUs of
  the machine (CUDA_VISIBLE_DEVICES, from --gpus or all that nvidia-smi lists). Finished runs are
  skipped; a stopped one resumes from its newest checkpoint, so a killed or requeued sweep
  continues where it was.
- `--pack N` (accelerators): up to N runs that differ only in settings a population takes (seed, LR,
  warmup, weight decay, ProRes T, scale_updates, forward; andrea_jax/train/population.py) train as
  one population process, each run still in its own folder; a run no population can train is
  refused by name. On a CPU one process per core measures faster (docs/POPULATIONS.md).
- `--slurm` writes RUNS/sweep.sbatch instead, a job array of one task per run (requeued on
  preemption; the trainer checkpoints on the SIGTERM Slurm sends before it), for `sbatch`.
- `--report` writes OUT/RESULTS.md (default RUNS/report) with the reproduction's paired tables
  (paired-t interval, exact sign-flip p, n) and figures, one section per group.
- `--set KEY=VALUE` adds an override to every run; `--toy` shrinks every group to 2 arms, 1 seed and
  a few steps of a 2-layer model, to try a spec out.
- `--groups G ...` and `--arms A ...` train only those groups and arms: a sweep too long for one
  sitting runs in parts, each resuming into the same run folders; `--report` covers every arm.

A spec may also name one of the reproduction's experiments (scripts/sweeps/ablation.py:
`SWEEP = experiments.ABLATION`); then RUNS defaults to runs/prores_repro and OUT to docs, and the
report is the reproduction's, over every experiment with runs there, as scripts/reproduce_prores.py
writes it.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import pathlib
import runpy
import shlex
import subprocess
import sys

from andrea_jax import config as config_lib, configs
from andrea_jax.errors import AndreaError, ConfigError
from andrea_jax.repro import experiments, runner

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository


@dataclasses.dataclass(frozen=True)
class Sweep:
    name: str
    config: str                  # the base config, as train.py --config takes it
    axes: dict                   # "section.key" -> list of values; the grid is their product
    baseline: dict | str         # the paired baseline: values of some axes ({"prores.schedule": "none"}),
                                 # or with explicit `arms`, the name of one of them
    seeds: tuple = (0,)
    common: tuple = ()           # overrides of every run ("train.steps=300", ...)
    arms: dict | None = None     # explicit arms, {name: overrides}, for arms that are not a grid (a T
                                 # sweep beside "none"); then every axis makes groups


def _label(assignments: dict) -> str:
    """A folder-safe name of some axis values: key=value pairs by the keys' last part."""
    return ",".join(f"{k.split('.')[-1]}={v}" for k, v in assignments.items()) or "all"


def _validated(name: str, config: str, common, arms: dict, extra=()) -> None:
    """Every arm's config, before any run starts (ConfigError names the run and the key)."""
    for sets in arms.values():
        try:
            config_lib.validate(config_lib.override(configs.load(config), [*common, *sets, *extra]))
        except ConfigError as e:
            raise ConfigError(f"sweep {name}, run {' '.join(sets)}: {e}") from None


def _arms(sweep: Sweep) -> tuple[dict, str, list]:
    """(arms {name: overrides}, the baseline arm's name, the axes that make groups)."""
    if sweep.arms is not None:
        if not isinstance(sweep.baseline, str) or sweep.baseline not in sweep.arms:
            raise ConfigError(f"sweep {sweep.name}: with explicit arms the baseline is one arm's name "
                              f"(one of {list(sweep.arms)}); got {sweep.baseline!r}")
        return {a: tuple(sets) for a, sets in sweep.arms.items()}, sweep.baseline, list(sweep.axes)
    unknown = set(sweep.baseline) - set(sweep.axes) if isinstance(sweep.baseline, dict) else True
    if unknown or not sweep.baseline:
        raise ConfigError(f"sweep {sweep.name}: the baseline must give values of its axes; "
                          f"got {sweep.baseline} for axes {list(sweep.axes)}")
    for key, value in sweep.baseline.items():
        if value not in sweep.axes[key]:
            raise ConfigError(f"sweep {sweep.name}: baseline {key}={value} is not one of {sweep.axes[key]}")
    arm_keys = list(sweep.baseline)
    arms = {}
    for arm_values in itertools.product(*(sweep.axes[k] for k in arm_keys)):
        arm = dict(zip(arm_keys, arm_values))
        arms[_label(arm)] = tuple(f"{k}={v}" for k, v in arm.items())
    return arms, _label(sweep.baseline), [k for k in sweep.axes if k not in sweep.baseline]


def groups(sweep: Sweep | experiments.Experiment, spec: str = "SPEC", extra=()) -> dict[str, experiments.Experiment]:
    """The sweep as the reproduction's experiments, one per value of the axes outside the arms
    (named NAME/GROUP; NAME alone when no axis is left), every run's settings validated before
    anything runs. A reproduction experiment (andrea_jax/repro/experiments.py) is a spec too: one
    group, its own arms, seeds and report text, so it runs where scripts/reproduce_prores.py runs it."""
    if isinstance(sweep, experiments.Experiment):
        _validated(sweep.name, sweep.config, sweep.common, sweep.arms, extra)
        return {sweep.name: sweep}
    arms, baseline, group_keys = _arms(sweep)
    out = {}
    for group_values in itertools.product(*(sweep.axes[k] for k in group_keys)):
        group = dict(zip(group_keys, group_values))
        common = (*sweep.common, *(f"{k}={v}" for k, v in group.items()))
        _validated(f"{sweep.name} {_label(group)}", sweep.config, common, arms, extra)
        if not any(s.startswith("train.steps=") for s in common):  # stated: the runner checks a run finished them
            first_arm = next(iter(arms.values()))
            steps = config_lib.override(configs.load(sweep.config), [*common, *first_arm]).train.steps
            common += (f"train.steps={steps}",)
        name = f"{sweep.name}/{_label(group)}" if group else sweep.name
        out[name] = experiments.Experiment(
            name=name, title=f"Sweep {sweep.name}: {_label(group)}", config=sweep.config, arms=arms, common=common,
            seeds=tuple(sweep.seeds), baseline=baseline, paper="a sweep: no claim of the paper",
            scale=f"`--config {sweep.config}` with {' '.join(common) or 'no overrides'}",
            command=f"python -m andrea_jax.repro.sweep {spec} --report")
    return out


def select(exps: dict, groups=None, arms=None) -> dict:
    """The groups of `exps` named in `groups` (as a group's name ends: "n_layer=12"; a sweep without
    axes is one group, named as the sweep), each with only the arms named in `arms`; None keeps all."""
    label = lambda name: name.split("/", 1)[-1]
    chosen = {name: exp for name, exp in exps.items() if groups is None or label(name) in groups}
    unknown = sorted(set(groups or ()) - {label(name) for name in exps})
    if unknown:
        raise ConfigError(f"--groups {' '.join(unknown)}: the sweep's groups are {[label(n) for n in exps]}")
    if arms is None:
        return chosen
    for exp in chosen.values():
        if unknown := [a for a in arms if a not in exp.arms]:
            raise ConfigError(f"--arms {' '.join(unknown)}: {exp.name} has the arms {list(exp.arms)}")
    return {name: dataclasses.replace(exp, arms={a: exp.arms[a] for a in arms}) for name, exp in chosen.items()}


def plan(exps: dict, runs_root: pathlib.Path, extra=()) -> dict:
    """{run name: (command, workdir, steps)} over every group, seeds outermost; an experiment's
    precheck runs (RUNS/NAME/precheck) come first."""
    runs = {}
    for exp in exps.values():
        if exp.precheck_steps:
            pre = runner.precheck_plan(exp, runs_root / exp.name, extra)
            runs |= {f"{exp.name}/precheck/{k}": v for k, v in pre.items()}
    for exp in exps.values():
        runs |= {f"{exp.name}/{k}": v for k, v in runner.plan(exp, runs_root / exp.name, extra=extra).items()}
    return runs


def slurm_script(name: str, runs: dict, code: pathlib.Path, gpus_per_run: int) -> str:
    """An sbatch job array, task i running the i-th command of `runs` from the code snapshot."""
    commands = [shlex.join(command) for command, _, _ in runs.values()]
    logs = code.parent / "slurm"
    return "\n".join([
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --array=0-{len(commands) - 1}",
        "#SBATCH --requeue",                  # a preempted task goes back in the queue and resumes
        "#SBATCH --signal=TERM@120",          # SIGTERM 2 min before the time limit: the trainer checkpoints
        f"#SBATCH --output={logs}/%A_%a.out",
        *([f"#SBATCH --gpus-per-task={gpus_per_run}"] if gpus_per_run else []),
        "set -euo pipefail",
        f"mkdir -p {shlex.quote(str(logs))}",
        f"cd {shlex.quote(str(code))}",
        f"export PYTHONPATH={shlex.quote(str(code))}",
        "COMMANDS=(",
        *[f"  {shlex.quote(c)}" for c in commands],
        ")",
        'eval "exec ${COMMANDS[$SLURM_ARRAY_TASK_ID]}"',
        ""])


def visible_gpus() -> list[str]:
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(listed.splitlines()) if line.startswith("GPU ")]


def device_sets(gpus: list[str], per_run: int) -> list[str]:
    if len(gpus) < per_run:
        raise ConfigError(f"--gpus-per-run {per_run}: only {len(gpus)} GPU(s) visible ({','.join(gpus) or 'none'})")
    return [",".join(gpus[i:i + per_run]) for i in range(0, len(gpus) - per_run + 1, per_run)]


def run_spec(path: str, name: str):
    """The global `name` of the spec file `path` (None if it defines none), run with its folder on the
    path: a spec may import a module beside it (scripts/sweeps/_questions.py: what several specs share)."""
    if not pathlib.Path(path).is_file():
        raise ConfigError(f"{path}: no such spec file")
    folder = str(pathlib.Path(path).resolve().parent)
    sys.path.insert(0, folder)
    try:
        return runpy.run_path(path).get(name)
    finally:
        sys.path.remove(folder)


def load_spec(path: str) -> Sweep | experiments.Experiment:
    sweep = run_spec(path, "SWEEP")
    if not isinstance(sweep, (Sweep, experiments.Experiment)):
        raise ConfigError(f"{path}: defines no SWEEP = andrea_jax.repro.sweep.Sweep(...) "
                          "(or a reproduction experiment, andrea_jax.repro.experiments.EXPERIMENTS[NAME])")
    return sweep


def launch(name: str, exps: dict, chosen: dict, runs_root: pathlib.Path, args) -> None:
    """Train the `chosen` groups of `exps` into runs_root: the code snapshot (once), each group's
    experiment.json, then either the Slurm array (args.slurm) or the runs, locally, each group
    adding its share of the wall time to its wall.json. `args` holds the command's set, jobs,
    slurm, gpus_per_run, gpus, toy and pack (runner.run_all's; 1 where absent)."""
    runs = plan(chosen, runs_root, args.set)
    code = runs_root / "code"
    if not code.exists():
        runner.snapshot_code(ROOT, code)
    for exp in exps.values():
        (runs_root / exp.name).mkdir(parents=True, exist_ok=True)
        (runs_root / exp.name / "experiment.json").write_text(json.dumps(
            {"toy": getattr(args, "toy", False), "seeds": list(exp.seeds), "arms": list(exp.arms), "extra": args.set,
             "jobs": args.jobs}, indent=1))
    if args.slurm:
        path = runs_root / "sweep.sbatch"
        path.write_text(slurm_script(name, runs, code, args.gpus_per_run))
        print(f"wrote {path}: {len(runs)} array tasks; submit with: sbatch {path}")
        return
    slots = None
    if args.gpus_per_run:
        slots = device_sets(args.gpus.split(",") if args.gpus else visible_gpus(), args.gpus_per_run)
    seconds = runner.run_all(runs, code, args.jobs, resume=True, device_sets=slots, pack=getattr(args, "pack", 1))
    share = seconds / len(chosen)  # the groups ran together: each gets its part
    for exp in chosen.values():  # the wall time the report quotes, summed over invocations
        wall = runs_root / exp.name / "wall.json"
        before = json.loads(wall.read_text())["seconds"] if wall.is_file() else 0.0
        wall.write_text(json.dumps({"seconds": before + share}))


def launch_then_report(name: str, exps: dict, chosen: dict, runs_root: pathlib.Path, args, write_report) -> None:
    """What a sweep-like command does once its groups are known: `launch` unless --report alone
    is asked for, then, unless it wrote a Slurm array, `write_report()` and the paths it wrote."""
    if not args.report or args.slurm:
        launch(name, exps, chosen, runs_root, args)
        if args.slurm:
            return
    written = write_report()
    print("wrote " + ", ".join(str(p) for p in written[:2]))


def one_line_errors(command) -> int:
    """Runs a sweep-like command's work, `command()`: 0, or an AndreaError's exit code after its one
    line on stderr."""
    try:
        command()
    except AndreaError as e:
        print(f"{'config error' if isinstance(e, ConfigError) else 'error'}: {e}", file=sys.stderr)
        return e.exit_code
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", help="a Python file defining SWEEP = Sweep(...)")
    parser.add_argument("--runs", type=pathlib.Path, default=None,
                        help="default: runs/sweeps/NAME (a reproduction experiment: runs/prores_repro)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time on the CPU")
    parser.add_argument("--gpus-per-run", type=int, default=0, help="K > 0: one run per K GPUs")
    parser.add_argument("--gpus", default=None, help="the GPU ids to use (default: all nvidia-smi lists)")
    parser.add_argument("--pack", type=int, default=1, metavar="N",
                        help="train up to N runs that differ only in settings a population takes as one population "
                             "process (accelerators; on a CPU one process per core is faster): docs/POPULATIONS.md")
    parser.add_argument("--slurm", action="store_true", help="write RUNS/sweep.sbatch instead of running")
    parser.add_argument("--report", action="store_true", help="write the report of the runs so far")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="the report's folder (default RUNS/report; a reproduction experiment: docs)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="extra override of every run (part of each run's command)")
    parser.add_argument("--toy", action="store_true",
                        help="each group shrunk to 2 arms, 1 seed, a few steps of a 2-layer model: a smoke test")
    parser.add_argument("--groups", nargs="+", default=None, metavar="GROUP",
                        help="train only these groups (e.g. n_layer=12); the rest resume later")
    parser.add_argument("--arms", nargs="+", default=None, metavar="ARM",
                        help="train only these arms of each group; the rest resume later")
    args = parser.parse_args(argv)
    if args.pack < 1 or (args.pack > 1 and args.slurm):
        parser.error("--pack N: N >= 1, and not with --slurm (an array task runs one run)")

    def run() -> None:
        sweep = load_spec(args.spec)
        exps = groups(sweep, args.spec, args.set)
        if args.toy:
            exps = {name: experiments.toy(exp) for name, exp in exps.items()}
        reproduction = isinstance(sweep, experiments.Experiment)  # its runs and report are the reproduction's
        default_runs = ROOT / "runs" / ("prores_repro" if reproduction else f"sweeps/{sweep.name}")
        runs_root = (args.runs or default_runs).resolve()
        chosen = select(exps, args.groups, args.arms)
        from andrea_jax.repro import report
        out = (args.out or (ROOT / "docs" if reproduction else runs_root / "report")).resolve()
        launch_then_report(sweep.name, exps, chosen, runs_root, args,
                           lambda: report.write_all(runs_root, out, exps=None if reproduction else exps))
    return one_line_errors(run)


if __name__ == "__main__":  # run the imported module: a spec imports its Sweep, not __main__'s
    from andrea_jax.repro import sweep as _imported
    sys.exit(_imported.main())
