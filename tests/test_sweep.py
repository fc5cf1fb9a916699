"""python -m andrea_jax.repro.sweep on a 2 x 2 grid (depth x ProRes schedule, baseline: no ProRes) of
2 seeds, trained 2 at a time on the CPU: killed mid-run, the rerun resumes the stopped runs from
their checkpoints and retrains none of the finished ones; the report pairs each arm with the
baseline of its group; --slurm writes one array task per run with the runner's command."""
import dataclasses
import itertools
import json
import math
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from andrea_jax.repro import ladder as ladder_lib, sweep as sweep_lib
from andrea_jax.errors import ConfigError
from andrea_jax.repro.sweep import Sweep
from andrea_jax.repro import experiments, runner

ROOT = pathlib.Path(__file__).resolve().parent.parent

# A run checkpoints at step 20 and trains 80 steps more: the window in which the test finds one stopped
# mid-run and kills the sweep.
CHECKPOINT_EVERY = 20
SPEC = '''
from andrea_jax.repro.sweep import Sweep
SWEEP = Sweep(
    name="toy", config="tiny",
    axes={{"model.n_layer": [1, 2], "prores.schedule": ["none", "linear"]}},
    baseline={{"prores.schedule": "none"}},
    seeds=(0, 1),
    common=("model.d_model=32", "model.n_head=2", "model.seq_len=16", "model.vocab_size=300",
            "data.tokenizer={tok}", "train.batch_size=2", "train.steps=100", "train.checkpoint_every={every}",
            "train.eval_every=50", "train.eval_batches=1", "train.sample_tokens=0", "prores.warmup=20",
            "diagnostics.tensorboard=false"),
)
'''


def sweep_command(spec, runs, *flags):
    return [sys.executable, "-m", "andrea_jax.repro.sweep", str(spec), "--runs", str(runs), "--jobs", "2", *flags]


def array_commands(script: str) -> list[str]:
    """The command of each array task of a --slurm script, in task order."""
    lines = script.splitlines()
    return [shlex.split(t.strip())[0] for t in lines[lines.index("COMMANDS=(") + 1:lines.index(")")]]


def test_a_grid_runs_two_at_a_time_resumes_after_a_kill_and_reports(tmp_path, tok_path):
    spec, runs = tmp_path / "toy_sweep.py", tmp_path / "runs"
    spec.write_text(SPEC.format(tok=tok_path, every=CHECKPOINT_EVERY))
    exps = sweep_lib.groups(sweep_lib.load_spec(str(spec)))
    assert list(exps) == ["toy/n_layer=1", "toy/n_layer=2"]
    assert list(exps["toy/n_layer=1"].arms) == ["schedule=none", "schedule=linear"]
    names = [f"{g}/{a}_s{s}" for s in (0, 1) for g in exps for a in exps[g].arms]

    first = subprocess.Popen(sweep_command(spec, runs), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
    done = lambda: {n for n in names if (runs / n / "result.json").is_file()}
    mid_run = lambda finished: [n for n in names if n not in finished
                                and (runs / n / "checkpoints" / str(CHECKPOINT_EVERY)).is_dir()]
    deadline = time.monotonic() + 400
    while not (len(finished := done()) >= 2 and mid_run(finished)):
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()[0][-3000:]
        time.sleep(0.01)
    os.killpg(first.pid, signal.SIGTERM)  # the sweep and its train.py processes, as a preemption would
    first.wait(timeout=120)
    finished = done()
    stopped = mid_run(finished)
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
    # The mean is the same under any pairing of the seeds; each seed's difference and the spread are not.
    assert ci["by_seed"] == pytest.approx({str(s): d for s, d in enumerate(paired)}, rel=0, abs=1e-12)
    # The paired-t 95% interval of 2 pairs: mean +- t_{0.975, 1} sd / sqrt(2), where t with 1 degree of
    # freedom is Cauchy (quantile tan(pi (p - 1/2))) and sd / sqrt(2) = |d0 - d1| / 2.
    half = math.tan(0.475 * math.pi) * abs(paired[0] - paired[1]) / 2
    assert [ci["t_lo"], ci["t_hi"]] == pytest.approx([ci["mean"] - half, ci["mean"] + half], rel=1e-9, abs=1e-12)

    slurm = subprocess.run(sweep_command(spec, runs, "--slurm"), cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    assert slurm.returncode == 0, slurm.stderr[-3000:]
    script = (runs / "sweep.sbatch").read_text()
    assert "#SBATCH --array=0-7" in script and "#SBATCH --requeue" in script
    planned = sweep_lib.plan(exps, runs.resolve())
    assert array_commands(script) == [shlex.join(c) for c, _, _ in planned.values()]


def test_the_shipped_spec_plans_its_grid():
    exps = sweep_lib.groups(sweep_lib.load_spec(str(ROOT / "scripts" / "sweeps" / "depth_x_schedule.py")))
    assert list(exps) == [f"depth_x_schedule/n_layer={n}" for n in (12, 24, 48)]
    assert list(exps["depth_x_schedule/n_layer=24"].arms) == [
        "schedule=none,scale_updates=none", "schedule=none,scale_updates=alpha",
        "schedule=linear,scale_updates=none", "schedule=linear,scale_updates=alpha"]
    assert len(sweep_lib.plan(exps, ROOT / "runs" / "unused")) == 36


def test_explicit_arms_cross_the_axes_and_name_their_baseline():
    exps = sweep_lib.groups(sweep_lib.load_spec(str(ROOT / "scripts" / "sweeps" / "t_by_depth.py")))
    assert list(exps) == ["t_by_depth/n_layer=4", "t_by_depth/n_layer=12"]
    deep = exps["t_by_depth/n_layer=12"]
    assert deep.arms == {"none": ("prores.schedule=none",),
                         "T10": ("prores.schedule=linear", "prores.warmup=10"),
                         "T100": ("prores.schedule=linear", "prores.warmup=100")}
    assert deep.baseline == "none" and deep.seeds == (0, 1)
    assert deep.common == ("model.norm=pre", "train.steps=600", "model.n_layer=12")
    runs = sweep_lib.plan(exps, pathlib.Path("/r"))
    assert len(runs) == 12
    command, workdir, steps = runs["t_by_depth/n_layer=12/T100_s1"]
    assert workdir == pathlib.Path("/r/t_by_depth/n_layer=12/T100_s1") and steps == 600
    assert command[1:] == ["train.py", "--config", "tiny", "--workdir", str(workdir),
                           *[a for s in ("model.norm=pre", "train.steps=600", "model.n_layer=12",
                                         "prores.schedule=linear", "prores.warmup=100", "train.seed=1")
                             for a in ("--set", s)]]
    # no axis left: one group, named as the sweep
    flat = Sweep(name="flat", config="tiny", axes={}, arms={"a": ("prores.schedule=none",)}, baseline="a")
    assert list(sweep_lib.groups(flat)) == ["flat"]
    for bad, message in [(dict(arms={"a": ()}, baseline="b"), "one of ['a']"),
                         (dict(arms={"a": ()}, baseline={"prores.schedule": "none"}), "one arm's name"),
                         (dict(arms={"a": ("prores.schedule=sideways",)}, baseline="a"), "prores.schedule")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            sweep_lib.groups(Sweep(name="bad", config="tiny", axes={}, **bad))


def test_a_sweep_runs_in_parts_by_group_and_arm_into_the_same_runs(tmp_path, capsys):
    spec = str(ROOT / "scripts" / "sweeps" / "t_by_depth.py")
    exps = sweep_lib.groups(sweep_lib.load_spec(spec))
    part = sweep_lib.select(exps, groups=["n_layer=12"], arms=["none", "T100"])
    assert list(part) == ["t_by_depth/n_layer=12"]
    assert list(part["t_by_depth/n_layer=12"].arms) == ["none", "T100"]
    whole, planned = sweep_lib.plan(exps, pathlib.Path("/r")), sweep_lib.plan(part, pathlib.Path("/r"))
    assert sorted(planned) == [f"t_by_depth/n_layer=12/{a}_s{s}" for a in ("T100", "none") for s in (0, 1)]
    assert all(planned[n] == whole[n] for n in planned)  # the same commands and folders: the parts resume as one
    assert sweep_lib.select(exps) == exps
    assert list(sweep_lib.select(exps, arms=["T10"])) == list(exps)
    for flag, bad in [("--groups", "n_layer=7"), ("--arms", "T1000")]:
        assert sweep_lib.main([spec, "--runs", str(tmp_path / "runs"), flag, bad]) != 0
        assert f"{flag} {bad}" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # refused before any run, snapshot or folder


def test_a_missing_spec_is_one_line_and_exit_2_for_a_sweep_and_a_ladder(tmp_path, capsys):
    for main in (sweep_lib.main, ladder_lib.main):
        assert main([str(tmp_path / "nope.py"), "--runs", str(tmp_path / "runs")]) == 2
        assert capsys.readouterr().err == f"config error: {tmp_path / 'nope.py'}: no such spec file\n"


def test_the_command_with_groups_and_arms_writes_only_those_runs_to_the_slurm_array(tmp_path, capsys):
    spec, runs = str(ROOT / "scripts" / "sweeps" / "t_by_depth.py"), tmp_path / "runs"
    assert sweep_lib.main([spec, "--runs", str(runs), "--groups", "n_layer=12", "--arms", "none", "T100",
                           "--slurm"]) == 0
    # 2 arms x 2 seeds of one group, of the 2 x 3 x 2 runs of the whole sweep
    assert "sweep.sbatch: 4 array tasks" in capsys.readouterr().out
    script = (runs / "sweep.sbatch").read_text()
    assert "#SBATCH --array=0-3" in script.splitlines()
    want = [f"t_by_depth/n_layer=12/{a}_s{s}" for s in (0, 1) for a in ("none", "T100")]
    whole = sweep_lib.plan(sweep_lib.groups(sweep_lib.load_spec(spec)), runs.resolve())
    assert array_commands(script) == [shlex.join(whole[n][0]) for n in want]


@pytest.mark.parametrize("name", ["ablation", "stability", "tsweep", "postln_tsweep"])
def test_experiments_a_to_d_are_specs_that_plan_the_reproductions_runs(name):
    exp = experiments.EXPERIMENTS[name]
    assert sweep_lib.load_spec(str(ROOT / "scripts" / "sweeps" / f"{name}.py")) is exp
    runs = sweep_lib.plan(sweep_lib.groups(exp), pathlib.Path("/r"), ["model.vocab_size=300"])
    # The reproduction's runs, built here from the experiment's data: RUNS/NAME/ARM_sSEED, train.py with
    # the common overrides, the arm's, the seed and the extra ones; an experiment's precheck first.
    want = {}
    if exp.precheck_steps:
        for arm in list(exp.arms)[:2]:
            sets = [*exp.common, *exp.arms[arm], "train.seed=0", "model.vocab_size=300", *exp.precheck_sets]
            want[f"{name}/precheck/{arm}_s0"] = (pathlib.Path(f"/r/{name}/precheck/{arm}_s0"), sets)
    for seed in exp.seeds:
        for arm, arm_sets in exp.arms.items():
            want[f"{name}/{arm}_s{seed}"] = (pathlib.Path(f"/r/{name}/{arm}_s{seed}"),
                                             [*exp.common, *arm_sets, f"train.seed={seed}", "model.vocab_size=300"])
    assert list(runs) == list(want)
    for run, (workdir, sets) in want.items():
        command, planned_dir, _ = runs[run]
        assert planned_dir == workdir
        assert command[1:] == ["train.py", "--config", exp.config, "--workdir", str(workdir),
                               *[a for s in sets for a in ("--set", s)]]
    assert runs[f"{name}/{list(exp.arms)[0]}_s0"][2] == exp.steps()
    if name == "ablation":
        assert runs["ablation/precheck/none_s0"][2] == 150


# (report folder, the runs it names, the sweep spec whose groups it holds: None for the reproduction's)
KEPT_REPORTS = [("docs", "runs/prores_repro", None), ("docs/scaled", "runs/scaled", None),
                ("docs/depth_scaled", "runs/depth", None),
                *[(f"docs/muon/{name}", f"runs/sweeps/m_muon_{name}", f"scripts/sweeps/m_muon_{name}.py")
                  for name in ("grid_postln", "grid_tiny", "postln", "tiny")],
                *[(f"docs/h/{name}", f"runs/sweeps/h_{name}", f"scripts/sweeps/h_{name}.py")
                  for name in ("prores_or_warmup", "depth_params", "lr_control")],
                *[(f"docs/j/{name}", f"runs/sweeps/j_{name}", f"scripts/sweeps/j_{name}.py")
                  for name in ("sandwich", "weight_decay")],
                ("docs/k/paper_protocol", "runs/sweeps/k_postln_dose", "scripts/sweeps/k_postln_dose.py"),
                ("docs/k/scripts_protocol", "runs/sweeps/k_postln_dose_scripts",
                 "scripts/sweeps/k_postln_dose_scripts.py"),
                ("docs/k/function_preserving", "runs/sweeps/k_function_preserving",
                 "scripts/sweeps/k_function_preserving.py"),
                ("docs/g/depth_again", "runs/sweeps/g_depth_again", "scripts/sweeps/g_depth_again.py"),
                *[(f"docs/i/{name}", f"runs/sweeps/i_{name}", f"scripts/sweeps/i_{name}.py")
                  for name in ("postln_lr", "postln_lr_low", "postln_best")],
                *[(f"docs/l/{name}", f"runs/sweeps/l_{name}", f"scripts/sweeps/l_{name}.py")
                  for name in ("stage1_ext", "stage2", "none_lr_control")]]   # stage1's opens with a note by hand


@pytest.mark.parametrize("out, runs, spec", KEPT_REPORTS, ids=[k[0] for k in KEPT_REPORTS])
def test_kept_reports_regenerate_byte_for_byte_from_their_summaries(out, runs, spec, monkeypatch):
    from andrea_jax.repro import report
    monkeypatch.chdir(ROOT)  # the report names its folders relative to the working directory
    summary = json.loads((ROOT / out / "prores_repro" / "summary.json").read_text())
    known = list(experiments.EXPERIMENTS) if spec is None else list(sweep_lib.groups(sweep_lib.load_spec(spec)))
    assert report.markdown(summary, ROOT / out, runs, known) == (ROOT / out / "RESULTS.md").read_text()


def test_each_run_holds_its_own_gpus_while_it_runs(tmp_path, monkeypatch):
    # nvidia-smi -L as a 4-GPU machine prints it; 2 GPUs per run make 2 slots, "0,1" and "2,3".
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text("#!/bin/sh\n" + "".join(
        f'echo "GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})"\n' for i in range(4)))
    (fake_bin / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
    gpus = sweep_lib.visible_gpus()
    assert gpus == ["0", "1", "2", "3"]
    slots = sweep_lib.device_sets(gpus, 2)
    assert slots == ["0,1", "2,3"]
    with pytest.raises(ConfigError, match="only 4 GPU"):
        sweep_lib.device_sets(gpus, 8)
    # Six stand-in runs that each print the GPUs they see and hold them for a while.
    probe = "import os, time; print(os.environ['CUDA_VISIBLE_DEVICES']); time.sleep(0.4)"
    runs = {f"r{i}": ([sys.executable, "-c", probe], tmp_path / f"r{i}", 1) for i in range(6)}
    runner.run_all(runs, tmp_path, jobs=1, log=lambda *_: None, device_sets=slots)
    results = [json.loads((tmp_path / f"r{i}" / "result.json").read_text()) for i in range(6)]
    for i, r in enumerate(results):
        assert r["devices"] in slots
        assert (tmp_path / f"r{i}" / "train.log").read_text().strip() == r["devices"]   # what the process saw
    assert {r["devices"] for r in results} == set(slots)
    # two runs that overlapped in time never held the same GPUs; with 2 slots at most 2 ran at once
    for a, b in itertools.combinations(results, 2):
        if a["started"] < b["ended"] and b["started"] < a["ended"]:
            assert a["devices"] != b["devices"]
    moments = sorted(t for r in results for t in (r["started"], r["ended"]))
    assert max(sum(r["started"] <= t < r["ended"] for r in results) for t in moments) == 2


def test_pack_groups_the_runs_a_population_can_hold_and_refuses_one_no_population_can(tmp_path):
    """--pack N, planned without training: Experiment E at width 512's 6 arms are `none` (no ProRes) and 4 linear
    ones that differ only in the LR and prores.scale_updates, which a population holds per member."""
    width512 = experiments.SCALED_POST_LN_WIDTH_512
    runs = runner.plan(width512, tmp_path)
    assert runner.packs(runs, 3) == [["none_s0", "none_lr3e-4_s0"],
                                     ["linear_alpha_s0", "linear_s0", "linear_alpha_lr3e-4_s0"], ["linear_lr3e-4_s0"]]
    assert runner.packs(runs, 6) == [["none_s0", "none_lr3e-4_s0"],
                                     ["linear_alpha_s0", "linear_s0", "linear_alpha_lr3e-4_s0", "linear_lr3e-4_s0"]]
    assert runner.packs(runs, 1) == [[name] for name in runs]
    # Two seeds read two data orders: their runs never share a population.
    seeds = runner.plan(width512, tmp_path, seeds=[0, 1], arms=["none", "none_lr3e-4"])
    assert runner.packs(seeds, 4) == [["none_s0", "none_lr3e-4_s0"], ["none_s1", "none_lr3e-4_s1"]]
    command = runner.pack_command(runs, ["none_s0", "none_lr3e-4_s0"])
    assert command[command.index("--workdir") + 1] == str(tmp_path)
    members = [i for i, a in enumerate(command) if a == "--member"]
    assert [command[i + 1] for i in members] == ["none_s0", "none_lr3e-4_s0"]
    assert command[members[1] + 2:] == runner.command_parts(runs["none_lr3e-4_s0"][0])[1]
    muon = dataclasses.replace(width512, arms={"none": ("prores.schedule=none",),
                                               "muon": ("prores.schedule=none", "optim.name=muon")})
    with pytest.raises(ConfigError, match=r"--pack: run muon_s0 cannot be trained in a population \(optim\.name"):
        runner.packs(runner.plan(muon, tmp_path), 2)


def test_a_pack_trains_as_one_population_and_a_rerun_finds_its_runs_done(tmp_path, tok_path):
    exp = experiments.toy(dataclasses.replace(experiments.SCALED_POST_LN_WIDTH_512, arms={
        "lr1e-3": ("prores.schedule=linear", "optim.lr=1e-3"),
        "lr3e-3_alpha": ("prores.schedule=linear", "optim.lr=3e-3", "prores.scale_updates=alpha")}))
    # one block of width 32 (2 heads) instead of the toy's 2 of width 64 (8 heads): what is checked is the packing
    # of the runs into one process, which the shape leaves alone, and the smaller step compiles faster
    runs = runner.plan(exp, tmp_path / "width512", extra=["model.vocab_size=300", f"data.tokenizer={tok_path}",
                                                           "model.n_layer=1", "model.d_model=32", "model.n_head=2"])
    runner.snapshot_code(ROOT, tmp_path / "code")
    logged = []
    runner.run_all(runs, tmp_path / "code", 1, logged.append, pack=2)
    assert logged[0] == "0 of 2 runs already done; training 2, 1 at a time, in 1 processes of up to 2 runs (--pack)"
    for name, (command, workdir, steps) in runs.items():
        result = json.loads((workdir / "result.json").read_text())
        assert result["outcome"] == "finished" and result["pack"] == list(runs), result
        assert result["command"] == shlex.join(command[1:])  # its own: a rerun without --pack finds it done too
        assert "ANDREA population: 2 members" in (workdir / "train.log").read_text()
        config = json.loads((workdir / "config.json").read_text())
        assert config["optim"]["lr"] == float(name[2:6]) and config["train"]["steps"] == steps
    logged.clear()
    runner.run_all(runs, tmp_path / "code", 1, logged.append)
    assert logged == ["2 of 2 runs already done; training 0, 1 at a time"]
