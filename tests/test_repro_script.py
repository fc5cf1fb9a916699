"""scripts/reproduce_prores.py end to end at a toy size: 2 arms, 1 seed, 4 steps of a 2-layer
model, trained in 2 processes, one after the other; then the report, summary.json and figures, and a
rerun that finds both runs done and trains nothing."""
import json
import math
import os
import pathlib
import subprocess
import sys
import tarfile

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


# The toys of experiments A and D are one Post-LN recipe (Experiment A's) with different arms, and the XLA
# cache is shared: with the same ProRes T their arms are the same programs, compiled once. A's linear arm
# takes D's T2 arm's T, so A and D compile only the none arm and one linear arm.
SHARED_T = ("--set", "prores.warmup=2")


def toy_command(experiment: str, tmp_path, tok_path, *sets: str) -> list:
    """The reproduction's toy of `experiment` on the test tokenizer; `sets` come last, after the toy's own.
    One run at a time: the second finds the programs the arms share (the state's initialisation) compiled by
    the first, where two at once would both compile them."""
    return [sys.executable, str(ROOT / "scripts" / "reproduce_prores.py"), "--experiment", experiment,
            "--toy", "--jobs", "1", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "docs"),
            "--set", "model.vocab_size=300", "--set", f"data.tokenizer={tok_path}", *sets]


def val_losses(run_dir) -> list:
    """A run's validation losses in step order, read from its own metrics.jsonl."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [line["val_loss"] for line in lines if "val_loss" in line]


def table_row(report: str, first_cell: str) -> list:
    """The cells of the one markdown table row that starts with `first_cell`."""
    rows = [line for line in report.splitlines() if line.startswith(f"| {first_cell} |")]
    assert len(rows) == 1, rows
    return [cell.strip() for cell in rows[0].strip("|").split("|")]


def check_figure(path, size, colors=()):
    """The PNG has the figure's size (figsize x dpi 100, andrea_jax/repro/figures.py) and is not
    blank; each (color, alpha, n) of `colors` (drawn over white) covers at least n pixels."""
    import matplotlib.colors
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    rgb = matplotlib.image.imread(path)[..., :3]
    assert rgb.shape[:2] == size[::-1], (path, rgb.shape)
    # measured 3.9% (escape rates) to 7.2% (loss by arm) of the pixels not near white
    assert np.mean(np.any(rgb < 0.95, axis=-1)) > 0.02, path
    for color, alpha, at_least in colors:
        want = alpha * np.asarray(matplotlib.colors.to_rgb(color)) + (1 - alpha)
        assert np.sum(np.all(np.abs(rgb - want) < 0.02, axis=-1)) >= at_least, (path, color)


def test_toy_ablation_writes_report_and_figures_and_resumes(tmp_path, tok_path):
    command = toy_command("ablation", tmp_path, tok_path, *SHARED_T)
    first = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "0 of 2 runs already done" in first.stdout

    docs = tmp_path / "docs"
    report = (docs / "RESULTS.md").read_text()
    assert "| paper table | finding | paper | ours | direction holds? |" in report
    assert "| none | 1 / 0 / 0 |" in report and "| linear | 1 / 0 / 0 |" in report
    summary = json.loads((docs / "prores_repro" / "summary.json").read_text())["experiments"]["ablation"]
    assert set(summary["arms"]) == {"none", "linear"} and summary["toy"]
    assert summary["runs"]["none_s0"]["outcome"] == "finished"

    # The numbers, recomputed from the runs' own metrics: the summary's and the report's.
    vals = {arm: val_losses(tmp_path / "runs" / "ablation" / f"{arm}_s0") for arm in ("none", "linear")}
    final = {arm: v[-1] for arm, v in vals.items()}
    paired = final["linear"] - final["none"]   # arm - none, same seed
    assert paired != 0.0
    for arm in ("none", "linear"):
        assert summary["runs"][f"{arm}_s0"]["final_val_loss"] == final[arm]
        assert summary["runs"][f"{arm}_s0"]["best_val_loss"] == min(vals[arm])
        assert table_row(report, arm)[3] == f"{final[arm]:.3f} ± 0.000 (n=1)"   # final val loss
        assert f"{arm}_s0 finished, final {final[arm]:.3f}, best {min(vals[arm]):.3f}" in report
    ci = summary["arms"]["linear"]["paired_final_val_loss"]
    assert ci["n"] == 1 and ci["mean"] == ci["lo"] == ci["hi"] == pytest.approx(paired, rel=1e-12, abs=0)
    # One pair: no t interval; both sign flips reach |d|, so p = 1, which is also the smallest p n = 1 allows.
    assert ci["p"] == ci["p_min"] == 1.0 and math.isnan(ci["t_lo"])
    assert table_row(report, "linear")[5] == f"{paired:+.3f} [no interval] (n=1, p=1, min p 1)"
    assert table_row(report, "linear")[6] == f"[{paired:+.3f}, {paired:+.3f}]"   # the bootstrap column
    # the paper comparison quotes the paired difference to 3 significant digits
    assert f"one seed ({paired:+.3g}): no interval" in report

    wide, one_panel, small = (1300, 450), (650, 450), (600, 350)  # figsize x 100 dpi
    # Pixels of each arm's colour (none, linear: tab10 colours 0 and 1); measured 98 to 1,355
    # (98: the none loss curve mostly hidden under linear's); the escape rates are bars of height 0.
    arms = lambda alpha: [("tab:blue", alpha, 20), ("tab:orange", alpha, 20)]
    for name, size, colors in [("loss_by_arm", wide, arms(1.0)), ("escape_rates", small, ()),
                               ("grad_ratio", one_panel, arms(0.8)),  # lines drawn at alpha 0.8
                               ("activation_growth", wide, arms(1.0))]:
        check_figure(docs / "prores_repro" / "ablation" / f"{name}.png", size, colors)
        assert f"prores_repro/ablation/{name}.png" in report

    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 of 2 runs already done; training 0" in again.stdout

    # Experiment A as a sweep spec (scripts/sweeps/ablation.py), on the same folders and overrides:
    # the sweep runner plans the same runs, finds both done, and writes the same report, byte for byte.
    written = {p: p.read_bytes() for p in [docs / "RESULTS.md", *(docs / "prores_repro").rglob("*") ] if p.is_file()}
    sweep = subprocess.run([sys.executable, "-m", "andrea_jax.repro.sweep",
                            str(ROOT / "scripts" / "sweeps" / "ablation.py"), *command[command.index("--toy"):]],
                           capture_output=True, text=True, timeout=300)
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    assert "2 of 2 runs already done; training 0" in sweep.stdout
    rewritten = {p: p.read_bytes() for p in [docs / "RESULTS.md", *(docs / "prores_repro").rglob("*")] if p.is_file()}
    assert len(written) == 7 and rewritten == written   # RESULTS.md, summary.json and the 5 figures


def test_toy_post_ln_t_sweep_plots_loss_against_t_l_over_steps(tmp_path, tok_path):
    command = toy_command("postln_tsweep", tmp_path, tok_path)
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    docs = tmp_path / "docs"
    report = (docs / "RESULTS.md").read_text()
    assert "## Experiment D: Post-LN at depth 24, linear ProRes against T" in report
    assert "| none | 1 / 0 / 0 |" in report and "| T2 | 1 / 0 / 0 |" in report
    # The toy is a 2-layer model of 4 steps: T L / steps = 2 * 2 / 4.
    assert "- T L / steps: T2 1.00;" in report
    config = json.loads((tmp_path / "runs" / "postln_tsweep" / "T2_s0" / "config.json").read_text())
    assert (config["model"]["norm"], config["prores"]["schedule"], config["prores"]["warmup"]) == ("post", "linear", 2)
    # One point per seed of each T arm (tab:blue; measured 8 pixels, the rest under the mean's
    # marker), the arm's mean (tab:red, 38) and the none arm as a gray band at alpha 0.3 (1,196).
    check_figure(docs / "prores_repro" / "postln_tsweep" / "t_sweep.png", (700, 450),
                 [("tab:blue", 1.0, 4), ("tab:red", 1.0, 20), ("gray", 0.3, 200)])
    assert "prores_repro/postln_tsweep/t_sweep.png" in report


def test_gpu_width_smoke_trains_the_width_512_sweep_as_populations_and_reports_each_run(tmp_path, tok_path):
    # scripts/gpu_width.sh as the GPU machine runs it (the sweep of scripts/sweeps/l_width512.py, each
    # run's line as it ends, the report), in its --smoke form: --toy's first two runs, `none` at LR 3e-4
    # and 1e-3, as 2 layers of width 64 for 4 steps, here with 4 heads (from 8) on the embedded corpus
    # (from the GPU subset), one population of both (the script's --pack 3).
    env = {**os.environ, "OUT": str(tmp_path / "out"), "RUNS": str(tmp_path / "runs"), "PYTHON": sys.executable}
    sets = ["data.source=embedded", "data.path=", "model.vocab_size=300", f"data.tokenizer={tok_path}",
            "model.n_head=4"]
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_width.sh"), "--smoke",
                          *(a for s in sets for a in ("--set", s))],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    out = tmp_path / "out"
    finished = [json.loads(line) for line in (out / "gpu_width_runs.jsonl").read_text().splitlines()]
    assert sorted(r["run"] for r in finished) == ["none_lr1e-3_s0", "none_lr3e-4_s0"]
    assert all(r["outcome"] == "finished" and r["step"] == 4 and math.isfinite(r["val_loss"]) for r in finished)
    runs = tmp_path / "runs" / "l_width512"
    for name, lr in (("none_lr3e-4_s0", 3e-4), ("none_lr1e-3_s0", 1e-3)):
        config = json.loads((runs / name / "config.json").read_text())
        assert (config["model"]["d_model"], config["model"]["n_layer"], config["model"]["norm"]) == (64, 2, "pre")
        assert (config["optim"]["lr"], config["prores"]["schedule"]) == (lr, "none")
        assert json.loads((runs / name / "result.json").read_text())["pack"]   # trained as one population
    assert (out / "RESULTS.md").read_text() == (tmp_path / "runs" / "report" / "RESULTS.md").read_text()
    assert "| none_lr3e-4 | 1 / 0 / 0 |" in (out / "RESULTS.md").read_text()
    assert set(json.loads((out / "summary.json").read_text())["experiments"]["l_width512"]["runs"]) == {
        "none_lr3e-4_s0", "none_lr1e-3_s0"}
    with tarfile.open(out / "runs.tar.gz") as archive:
        kept = sorted(archive.getnames())
    assert kept == sorted(f"l_width512/{run}/{file}" for run in ("none_lr3e-4_s0", "none_lr1e-3_s0")
                          for file in ("config.json", "metrics.jsonl", "result.json"))


@pytest.mark.parametrize("name", sorted(__import__("andrea_jax.repro.experiments", fromlist=["x"]).EXPERIMENTS))
def test_every_arm_of_every_experiment_is_a_valid_config_with_its_steps_stated(name):
    from andrea_jax import config as config_lib, configs
    from andrea_jax.repro import experiments, runner
    exp = experiments.EXPERIMENTS[name]
    assert exp.baseline in exp.arms
    for arm in exp.arms:
        sets = experiments.run_sets(exp, arm, 0)
        cfg = config_lib.validate(config_lib.override(configs.load(exp.config), sets))
        assert runner.steps_of(sets) == cfg.train.steps == exp.steps(), (name, arm)
