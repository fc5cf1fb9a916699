"""scripts/reproduce_prores.py end to end at a toy size: 2 arms, 1 seed, 4 steps of a 2-layer
model, trained in 2 processes; then the report, summary.json and figures, and a rerun that finds
both runs done and trains nothing."""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def toy_command(experiment: str, tmp_path, tok_path) -> list:
    return [sys.executable, str(ROOT / "scripts" / "reproduce_prores.py"), "--experiment", experiment,
            "--toy", "--jobs", "2", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "docs"),
            "--set", "model.vocab_size=300", "--set", f"data.tokenizer={tok_path}"]


def test_toy_ablation_writes_report_and_figures_and_resumes(tmp_path, tok_path):
    command = toy_command("ablation", tmp_path, tok_path)
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
    for name in ("loss_by_arm", "escape_rates", "grad_ratio", "activation_growth"):
        figure = docs / "prores_repro" / "ablation" / f"{name}.png"
        assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", figure
        assert f"prores_repro/ablation/{name}.png" in report

    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 of 2 runs already done; training 0" in again.stdout


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
    figure = docs / "prores_repro" / "postln_tsweep" / "t_sweep.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "prores_repro/postln_tsweep/t_sweep.png" in report
