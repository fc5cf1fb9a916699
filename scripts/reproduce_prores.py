"""The ProRes reproduction on a CPU, one command per experiment (definitions: andrea_jax/repro/experiments.py).

    python scripts/reproduce_prores.py --experiment ablation   # A: Post-LN none/linear/equal/reverse, depth 24
    python scripts/reproduce_prores.py --experiment stability  # B: Pre-LN at LR 3e-3: none/linear/learned gates
    python scripts/reproduce_prores.py --experiment tsweep     # C: T sweep on the README's `tiny` config
    python scripts/reproduce_prores.py --experiment postln_tsweep  # D: A's Post-LN setup, linear ProRes against T
    python scripts/reproduce_prores.py --report-only           # rewrite the report from finished runs

Runs go to RUNS/EXPERIMENT/ARM_sSEED (RUNS = runs/prores_repro), `--jobs` at a time, each a
`train.py` process started from a frozen copy of the code (RUNS/code); finished runs are kept and
skipped, so rerunning the same command resumes. Afterwards the report is rewritten from every
experiment that has runs: OUT/RESULTS.md, OUT/prores_repro/summary.json and the figures under
OUT/prores_repro/EXPERIMENT/ (OUT = docs). `--toy` shrinks an experiment to 2 arms, 1 seed and a
few steps of a 2-layer model (the test of this script).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from andrea_jax.repro import experiments, runner  # noqa: E402


def plan(exp, runs_dir: pathlib.Path, seeds, extra, arms) -> dict:
    """{name: (command, workdir, steps)}, seeds outermost: a stopped invocation leaves whole seeds."""
    runs = {}
    for seed in seeds:
        for arm in arms:
            sets, workdir = experiments.run_sets(exp, arm, seed, extra), runs_dir / f"{arm}_s{seed}"
            command = runner.train_command(exp.config, workdir, sets)
            runs[f"{arm}_s{seed}"] = (command, workdir, runner.steps_of(sets))
    return runs


def precheck(exp, runs_dir: pathlib.Path, code: pathlib.Path, extra, jobs: int) -> None:
    """The first two arms for a few steps; prints block 1's gradient norm over block L's."""
    from andrea_jax.repro import summarize
    arms = list(exp.arms)[:2]
    runs = plan(exp, runs_dir / "precheck", [0], [*extra, *exp.precheck_sets], arms)
    runner.run_all(runs, code, jobs)
    for name, (_, workdir, _) in runs.items():
        steps, ratio = summarize.grad_ratio_curve(workdir)
        print(f"precheck {name}: |grad block 1| / |grad block L| by step: " +
              ", ".join(f"{s}: {r:.2g}" for s, r in zip(steps, ratio)), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", choices=sorted(experiments.EXPERIMENTS))
    parser.add_argument("--seeds", type=int, default=None, 
                        help="number of seeds (0..N-1); default: the experiment's")
    parser.add_argument("--arms", nargs="+", default=None, help="only these arms (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="runs trained at once")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs", help="folder of RESULTS.md")
    parser.add_argument("--runs", type=pathlib.Path, default=ROOT / "runs" / "prores_repro")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="extra override of every run of the experiment")
    parser.add_argument("--code-ref", default=None,
                        help="train from this git commit (git archive) instead of the working tree")
    parser.add_argument("--toy", action="store_true", help="2 arms, 1 seed, a few steps: a smoke test")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if not (args.experiment or args.report_only):
        parser.error("give --experiment NAME or --report-only")
    runs_root = args.runs.resolve()

    if args.experiment and not args.report_only:
        exp = experiments.EXPERIMENTS[args.experiment]
        exp = experiments.toy(exp) if args.toy else exp
        seeds = list(range(args.seeds)) if args.seeds else list(exp.seeds)
        arms = args.arms or list(exp.arms)
        unknown = set(arms) - set(exp.arms)
        if unknown:
            parser.error(f"--arms: unknown {sorted(unknown)}; {exp.name} has {list(exp.arms)}")
        code = runs_root / "code"
        if not code.exists():
            runner.snapshot_code(ROOT, code, args.code_ref)
        runs_dir = runs_root / exp.name
        runs_dir.mkdir(parents=True, exist_ok=True)
        (runs_dir / "experiment.json").write_text(json.dumps(
            {"toy": args.toy, "seeds": seeds, "arms": arms, "extra": args.set, "jobs": args.jobs}, indent=1))
        start = time.perf_counter()
        if exp.precheck_steps:
            precheck(exp, runs_dir, code, args.set, args.jobs)
        runner.run_all(plan(exp, runs_dir, seeds, args.set, arms), code, args.jobs)
        wall = runs_dir / "wall.json"  # summed over the invocations that trained
        before = json.loads(wall.read_text())["seconds"] if wall.is_file() else 0.0
        wall.write_text(json.dumps({"seconds": before + time.perf_counter() - start}))

    from andrea_jax.repro import report
    written = report.write_all(runs_root, args.out.resolve(), toy=args.toy)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
