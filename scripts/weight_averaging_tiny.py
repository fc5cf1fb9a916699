"""Weight averaging on `tiny` (docs/averaging/PLAN.md): per seed one run with optim.ema, then the
final weights, their moving average and the mean of the last three checkpoints, each scored by
andrea-evaluate on the validation split.

    python scripts/weight_averaging_tiny.py --out docs/averaging [--runs runs/averaging] [--seeds 0,1,2]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SETS = ["train.checkpoint_every=100", "train.keep_checkpoints=10", "optim.ema=0.99", "train.sample_tokens=0"]
AVERAGED_STEPS = "400,500,600"


def run(*command: str) -> str:
    proc = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


def val_loss(*source: str) -> float:
    out = run("-m", "andrea_jax.serve.evaluate", *source)
    return float(re.search(r"loss ([0-9.]+) nats/token", out).group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", default="runs/averaging")
    parser.add_argument("--seeds", default="0,1,2")
    args = parser.parse_args()
    out, runs = pathlib.Path(args.out), pathlib.Path(args.runs).resolve()
    rows = []
    for seed in map(int, args.seeds.split(",")):
        workdir = runs / f"tiny_ema_s{seed}"
        if not (workdir / "checkpoints" / "600").is_dir():
            run("train.py", "--config", "tiny", "--workdir", str(workdir),
                *[a for s in [*SETS, f"train.seed={seed}"] for a in ("--set", s)])
        averaged = runs / f"tiny_avg_s{seed}"
        run("-m", "andrea_jax.serve.average", "--workdir", str(workdir), "--steps", AVERAGED_STEPS,
            "--out", str(averaged))
        row = {"seed": seed, "raw": val_loss("--workdir", str(workdir)),
               "ema": val_loss("--workdir", str(workdir), "--weights", "ema"),
               "avg": val_loss("--export", str(averaged))}
        print(json.dumps(row), flush=True)
        rows.append(row)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    lines = ["| seed | raw | ema | avg | ema - raw | avg - raw |", "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['seed']} | {r['raw']:.4f} | {r['ema']:.4f} | {r['avg']:.4f} | {r['ema'] - r['raw']:+.4f} | "
              f"{r['avg'] - r['raw']:+.4f} |" for r in rows]
    mean = lambda k: sum(r[k] - r["raw"] for r in rows) / len(rows)
    lines.append(f"| mean | | | | {mean('ema'):+.4f} | {mean('avg'):+.4f} |")
    (out / "RESULTS.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
