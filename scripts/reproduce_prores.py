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
few steps of a 2-layer model (the test of this script). `--from-summary` rewrites RESULTS.md from the
kept summary.json and READING.md alone (after editing the reading; the runs are not in git).

The same runs are sweep specs too (scripts/sweeps/ablation.py etc., `python -m andrea_jax.repro.sweep`),
which add GPU placement and Slurm job arrays.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from andrea_jax.repro import experiments, runner  # noqa: E402
from andrea_jax.errors import ConfigError  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", choices=sorted(experiments.EXPERIMENTS))
    parser.add_argument("--seeds", type=int, default=None, 
                        help="number of seeds (0..N-1); default: the experiment's")
    parser.add_argument("--arms", nargs="+", default=None, help="only these arms (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="runs trained at once")
    parser.add_argument("--pack", type=int, default=1, metavar="N",
                        help="train up to N runs a population can hold in one process (accelerators; sweep --pack)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs", help="folder of RESULTS.md")
    parser.add_argument("--runs", type=pathlib.Path, default=ROOT / "runs" / "prores_repro")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="extra override of every run of the experiment")
    parser.add_argument("--code-ref", default=None,
                        help="train from this git commit (git archive) instead of the working tree")
    parser.add_argument("--toy", action="store_true", help="2 arms, 1 seed, a few steps: a smoke test")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--from-summary", action="store_true",
                        help="rewrite OUT/RESULTS.md from the kept OUT/prores_repro/summary.json (no runs needed; "
                             "--runs: the folder the report names)")
    args = parser.parse_args(argv)
    if not (args.experiment or args.report_only or args.from_summary):
        parser.error("give --experiment NAME, --report-only or --from-summary")
    runs_root = args.runs.resolve()
    if args.from_summary:
        from andrea_jax.repro import report
        print(f"wrote {report.rewrite_from_summary(args.out.resolve(), report._shown(runs_root))}")
        return 0

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
        seconds = runner.precheck(exp, runs_dir, code, args.set, args.jobs) if exp.precheck_steps else 0.0
        try:
            seconds += runner.run_all(runner.plan(exp, runs_dir, seeds, arms, args.set), code, args.jobs,
                                      pack=args.pack)
        except ConfigError as e:  # --pack: a run no population can train
            print(f"config error: {e}", file=sys.stderr)
            return 2
        wall = runs_dir / "wall.json"  # summed over the invocations that trained
        before = json.loads(wall.read_text())["seconds"] if wall.is_file() else 0.0
        wall.write_text(json.dumps({"seconds": before + seconds}))

    from andrea_jax.repro import report
    written = report.write_all(runs_root, args.out.resolve(), toy=args.toy)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
