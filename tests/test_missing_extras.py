"""A command or setting that needs an optional extra, in an install without it, ends in one line on
stderr naming the extra and the pip command that installs it (exit 2), not in a traceback.

The test extra installs every extra, so each case runs its command in a process whose import
system refuses the extra's packages (tests/_refuse.py), as a machine without them would.
"""
import subprocess
import sys
import tomllib

import pytest

from _devices import cpu_devices_env
from _refuse import refusing_env
from test_multihost import ROOT

TOY = ["train.steps=2", "train.batch_size=4", "train.sample_tokens=0", "model.n_layer=1", "model.d_model=32",
       "model.seq_len=16", "model.vocab_size=300", "diagnostics.tensorboard=false"]


def command(script: str) -> list[str]:
    """The command line of a console script of pyproject.toml, run as pip's script runs it."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts[script].partition(":")
    return [sys.executable, "-c", f"import sys; from {module} import {function}; sys.exit({function}())"]


def run_without(tmp_path, refused: list[str], cmd: list[str]) -> subprocess.CompletedProcess:
    env = refusing_env(tmp_path / "refuse", refused,
                       {**cpu_devices_env(1), "ANDREA_CACHE": str(tmp_path / "cache")})
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def expect_one_line(proc, line: str) -> None:
    assert (proc.returncode, proc.stderr.strip()) == (2, line), proc.stderr[-3000:]


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("To be, or not to be, that is the question.\n")
    return folder


def test_prepare_without_beam(tmp_path, corpus):
    proc = run_without(tmp_path, ["apache_beam"], command("andrea-prepare") + [
        "--source", "files", "--path", str(corpus), "--out", str(tmp_path / "out")])
    expect_one_line(proc, 'error: andrea-prepare needs the beam extra: pip install -e ".[beam]"')
    assert not (tmp_path / "out").exists()   # refused before anything is written


def test_prepare_dask_runner_without_dask(tmp_path, corpus):
    proc = run_without(tmp_path, ["distributed", "dask"], command("andrea-prepare") + [
        "--source", "files", "--path", str(corpus), "--out", str(tmp_path / "out"), "--runner", "dask",
        "--workers", "1"])
    expect_one_line(proc, 'error: andrea-prepare --runner dask needs the dask extra: pip install -e ".[dask]"')


@pytest.mark.parametrize("flag", ["--path", "--out"])
def test_prepare_bucket_without_gcsfs(tmp_path, corpus, flag):
    paths = {"--path": str(corpus), "--out": str(tmp_path / "out"), flag: "gs://bucket/prefix"}
    proc = run_without(tmp_path, ["gcsfs"], command("andrea-prepare") + [
        "--source", "files", "--path", paths["--path"], "--out", paths["--out"]])
    expect_one_line(proc, f'error: {flag} gs://bucket/prefix needs the gcs extra: pip install -e ".[gcs]"')


def test_lm_eval_without_lm_eval(tmp_path):
    proc = run_without(tmp_path, ["lm_eval"], command("andrea-lm-eval") + ["--tasks", "x"])
    expect_one_line(proc, 'error: andrea-lm-eval needs the eval extra: pip install -e ".[eval]"')
    helped = run_without(tmp_path, ["lm_eval"], command("andrea-lm-eval") + ["--help"])
    assert helped.returncode == 0 and helped.stdout.startswith("usage: andrea-lm-eval")
    assert 'needs the eval extra: pip install -e ".[eval]"' in helped.stdout


def train(tmp_path, refused, *settings):
    cmd = [sys.executable, str(ROOT / "train.py"), "--config", "tiny", "--workdir", str(tmp_path / "w")]
    for s in settings:
        cmd += ["--set", s]
    return run_without(tmp_path, refused, cmd)


def test_train_bucket_data_without_gcsfs(tmp_path, tok_path):
    proc = train(tmp_path, ["gcsfs"], *TOY, f"data.tokenizer={tok_path}", "data.source=prepared",
                 "data.path=gs://bucket/prepared")
    expect_one_line(proc, 'error: data.path gs://bucket/prepared needs the gcs extra: pip install -e ".[gcs]"')


def test_train_wandb_without_wandb(tmp_path, tok_path):
    proc = train(tmp_path, ["wandb"], *TOY, f"data.tokenizer={tok_path}", "diagnostics.wandb=proj")
    expect_one_line(proc, 'error: diagnostics.wandb needs the wandb extra: pip install -e ".[wandb]"')


def test_train_triton_without_jax_triton(tmp_path, tok_path):
    # A missing install is no config mistake: "error", as for every other missing extra.
    proc = train(tmp_path, ["jax_triton", "triton"], *TOY, f"data.tokenizer={tok_path}", "kernels.impl=triton")
    expect_one_line(proc, 'error: kernels.impl=triton needs the cuda12 extra: pip install -e ".[cuda12]"')
