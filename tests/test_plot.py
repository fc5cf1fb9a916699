"""`python -m andrea_jax.repro.plot` makes its files from a short real training run."""
import json
import shutil
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest

from andrea_jax import config as config_lib, configs
from andrea_jax.repro import plot
from andrea_jax.train import loop as trainer

L = 3


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    cfg = config_lib.override(configs.load("tiny"), [
        "model.d_model=32", f"model.n_layer={L}", "model.n_head=2", "model.seq_len=32",
        "train.steps=6", "train.batch_size=4", "train.log_every=2", "train.eval_every=3",
        "train.eval_batches=1", "train.sample_tokens=0", "prores.schedule=linear", "prores.warmup=1",
        "diagnostics.every=2", "diagnostics.tensorboard=false"])
    workdir = tmp_path_factory.mktemp("runs") / "prores"
    trainer.train(config_lib.validate(cfg), workdir, show_progress=False)
    return workdir


def assert_png(path):
    assert path.is_file(), path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 200 and image.shape[1] > 300
    assert image[..., :3].std() > 0.05, f"{path} is blank"


def test_plot_command_draws_every_figure_of_real_runs(run_dir, tmp_path):
    # A second run without diagnostics: the real run's lines minus the per-layer ones.
    plain = tmp_path / "other" / "baseline"
    plain.mkdir(parents=True)
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    plain_lines = [{k: v for k, v in l.items() if not isinstance(v, list)} for l in lines]
    (plain / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in plain_lines))
    out = tmp_path / "plots"
    result = subprocess.run([sys.executable, "-m", "andrea_jax.repro.plot", str(run_dir), str(plain),
                             "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "baseline: no per-layer diagnostics" in result.stderr
    want = ["loss.png"] + [f"prores_{name}.png" for name in plot.PER_RUN]
    assert sorted(p.name for p in out.iterdir()) == sorted(want)
    assert result.stdout.split() == [str(out / name) for name in want]
    for name in want:
        assert_png(out / name)


def test_series_reads_the_per_layer_diagnostics(run_dir):
    run = plot.load_run(run_dir)
    steps, alpha = plot.series(run, "alpha")
    assert list(steps) == [1, 2, 4, 6]
    assert alpha.shape == (4, L)
    # Linear ProRes with T = 1: alpha(l, t) = min(t / l, 1) at t = step - 1.
    want = np.minimum(np.array([0, 1, 3, 5])[:, None] / np.arange(1, L + 1)[None], 1.0)
    np.testing.assert_allclose(alpha, want, rtol=1e-6)
    steps, val = plot.series(run, "val_loss")
    assert list(steps) == [3, 6] and np.all(np.isfinite(val))


def test_runs_with_the_same_folder_name_get_distinct_labels(run_dir, tmp_path):
    copy = tmp_path / "seed1" / run_dir.name
    shutil.copytree(run_dir, copy)
    out = tmp_path / "plots"
    written = plot.plot_all([run_dir, copy], out)
    assert len({p.name for p in written}) == len(written) == 1 + 2 * len(plot.PER_RUN)


def test_a_folder_without_metrics_is_a_clear_error(tmp_path):
    result = subprocess.run([sys.executable, "-m", "andrea_jax.repro.plot", str(tmp_path),
                             "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert f"{tmp_path} has no metrics.jsonl" in result.stderr
