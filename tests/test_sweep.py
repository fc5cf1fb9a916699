"""python -m andrea_jax.sweep on a 2 x 2 grid (depth x ProRes schedule, baseline: no ProRes) of
2 seeds, trained 2 at a time on the CPU: killed mid-run, the rerun resumes the stopped runs from
their checkpoints and retrains none of the finished ones; the report pairs each arm with the
baseline of its group; --slurm writes one array task per run with the runner's command."""
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time

from andrea_jax import sweep as sweep_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent

SPEC = '''
from andrea_jax.sweep import Sweep
SWEEP = Sweep(
    name="toy", config="tiny",
    axes={{"model.n_layer": [1, 2], "prores.schedule": ["none", "linear"]}},
    baseline={{"prores.schedule": "none"}},
    seeds=(0, 1),
    common=("model.d_model=32", "model.n_head=2", "model.seq_len=16", "model.vocab_size=300",
            "data.tokenizer={tok}", "train.batch_size=2", "train.steps=200", "train.checkpoint_every=20",
            "train.eval_every=100", "train.eval_batches=1", "train.sample_tokens=0", "prores.warmup=20",
            "diagnostics.tensorboard=false"),
)
'''


def sweep_command(spec, runs, *flags):
    return [sys.executable, "-m", "andrea_jax.sweep", str(spec), "--runs", str(runs), "--jobs", "2", *flags]


def test_a_grid_runs_two_at_a_time_resumes_after_a_kill_and_reports(tmp_path, tok_path):
    spec, runs = tmp_path / "toy_sweep.py", tmp_path / "runs"
    spec.write_text(SPEC.format(tok=tok_path))
    exps = sweep_lib.groups(sweep_lib.load_spec(str(spec)))
    assert list(exps) == ["toy/n_layer=1", "toy/n_layer=2"]
    assert list(exps["toy/n_layer=1"].arms) == ["schedule=none", "schedule=linear"]
    names = [f"{g}/{a}_s{s}" for s in (0, 1) for g in exps for a in exps[g].arms]

    first = subprocess.Popen(sweep_command(spec, runs), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
    done = lambda: {n for n in names if (runs / n / "result.json").is_file()}
    mid_run = lambda: [n for n in names if n not in done() and (runs / n / "checkpoints" / "20").is_dir()]
    deadline = time.monotonic() + 400
    while not (len(done()) >= 2 and mid_run()):
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()[0][-3000:]
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGTERM)  # the sweep and its train.py processes, as a preemption would
    first.wait(timeout=120)
    finished, stopped = done(), mid_run()
    assert stopped and len(finished) < len(names)
    results_before = {n: (runs / n / "result.json").read_text() for n in finished}

    again = subprocess.run(sweep_command(spec, runs), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"{len(finished)} of 8 runs already done; training {8 - len(finished)}, 2 at a time" in again.stdout
    for n in finished:  # not retrained
        assert (runs / n / "result.json").read_text() == results_before[n]
    for n in stopped:   # resumed from its checkpoint, not restarted
        assert "resumed at step" in (runs / n / "train.log").read_text(), n
    assert all(json.loads((runs / n / "result.json").read_text())["outcome"] == "finished" for n in names)

    report = (runs / "report" / "RESULTS.md").read_text()
    assert "## Sweep toy: n_layer=1" in report and "## Sweep toy: n_layer=2" in report
    # The paired difference against the baseline of the same group, recomputed from the runs.
    final = lambda n: [json.loads(l) for l in (runs / n / "metrics.jsonl").read_text().splitlines()][-1]["val_loss"]
    paired = [final(f"toy/n_layer=2/schedule=linear_s{s}") - final(f"toy/n_layer=2/schedule=none_s{s}") for s in (0, 1)]
    summary = json.loads((runs / "report" / "prores_repro" / "summary.json").read_text())["experiments"]
    ci = summary["toy/n_layer=2"]["arms"]["schedule=linear"]["paired_final_val_loss"]
    assert ci["n"] == 2 and abs(ci["mean"] - sum(paired) / 2) < 1e-12

    slurm = subprocess.run(sweep_command(spec, runs, "--slurm"), cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    assert slurm.returncode == 0, slurm.stderr[-3000:]
    script = (runs / "sweep.sbatch").read_text()
    assert "#SBATCH --array=0-7" in script and "#SBATCH --requeue" in script
    lines = script.splitlines()
    tasks = lines[lines.index("COMMANDS=(") + 1:lines.index(")")]
    planned = sweep_lib.plan(exps, runs.resolve())
    assert [shlex.split(t.strip())[0] for t in tasks] == [shlex.join(c) for c, _, _ in planned.values()]


def test_the_shipped_spec_plans_its_grid():
    exps = sweep_lib.groups(sweep_lib.load_spec(str(ROOT / "scripts" / "sweep_depth_x_schedule.py")))
    assert list(exps) == [f"depth_x_schedule/n_layer={n}" for n in (12, 24, 48)]
    assert list(exps["depth_x_schedule/n_layer=24"].arms) == [
        "schedule=none,scale_updates=none", "schedule=none,scale_updates=alpha",
        "schedule=linear,scale_updates=none", "schedule=linear,scale_updates=alpha"]
    assert len(sweep_lib.plan(exps, ROOT / "runs" / "unused")) == 36
