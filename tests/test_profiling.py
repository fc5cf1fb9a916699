"""What every run gives a GPU user: `mfu` in the metric lines (the model's FLOPs per token, from the
formula, x tokens/s over the chips' peak), a profiler trace of train.profile=START:END, and XLA's
persistent compilation cache in $ANDREA_CACHE/xla (train.compile_cache)."""
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from andrea_jax import config as config_lib, configs
from andrea_jax.errors import ConfigError
from andrea_jax.train import loop as trainer

ROOT = pathlib.Path(__file__).resolve().parent.parent
SMALL = ["model.d_model=32", "model.n_layer=2", "model.n_head=2", "model.seq_len=16", "model.vocab_size=300",
         "train.steps=4", "train.batch_size=4", "train.log_every=1", "train.eval_every=0", "train.eval_batches=1",
         "train.sample_tokens=0", "train.checkpoint_every=0", "diagnostics.tensorboard=false",
         "prores.schedule=linear", "prores.warmup=2"]


def test_metric_lines_carry_mfu_over_the_given_peak_and_the_profile_writes_a_trace(tmp_path, tok_path):
    cfg = config_lib.validate(config_lib.override(configs.load("tiny"), [
        *SMALL, f"data.tokenizer={tok_path}", "train.peak_tflops=2e-6", "train.profile=2:3"]))
    lines = trainer.train(cfg, tmp_path, show_progress=False)
    # The formula, written out for this shape: 6 x (L (4 D^2 + 2 D 4D) + V D) + 6 L D (T + 1)
    D, L, V, T = 32, 2, 300, 16
    flops_per_token = 6 * (L * (4 * D * D + 2 * D * 4 * D) + V * D) + 6 * L * D * (T + 1)
    assert [l["step"] for l in lines] == [1, 2, 3, 4]
    for line in lines:
        want = line["tokens_per_sec"] * flops_per_token / (2e-6 * 1e12 * jax.device_count())
        assert line["mfu"] == pytest.approx(want, rel=1e-12)
    traces = list((tmp_path / "profile").rglob("*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0


def test_no_peak_no_mfu_and_a_bad_profile_window_is_named(tmp_path, tok_path):
    # SMALL's train.steps as the test above: train.steps shapes the LR schedule, so the same steps compile once.
    cfg = config_lib.validate(config_lib.override(configs.load("tiny"), [*SMALL, f"data.tokenizer={tok_path}"]))
    assert "mfu" not in trainer.train(cfg, tmp_path, show_progress=False)[0]  # a CPU has no peak
    assert not (tmp_path / "profile").exists()
    for bad in ("3", "3:2", "0:2", "a:b"):
        with pytest.raises(ConfigError, match="train.profile"):
            config_lib.validate(config_lib.override(configs.load("tiny"), [f"train.profile={bad}"]))


def test_the_compile_cache_lives_in_andrea_cache_and_a_flag_turns_it_off(tmp_path, tok_path):
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}  # the tests' own cache
    runs = {}
    for name, flag in (("on", "true"), ("off", "false")):
        cache = tmp_path / f"cache_{name}"
        command = [sys.executable, str(ROOT / "train.py"), "--config", "tiny", "--workdir", str(tmp_path / name),
                   *[a for s in [*SMALL, f"data.tokenizer={tok_path}", "train.steps=1", f"train.compile_cache={flag}"]
                     for a in ("--set", s)]]
        run = subprocess.run(command, env={**env, "ANDREA_CACHE": str(cache)}, capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        runs[name] = sorted(p.name for p in (cache / "xla").iterdir()) if (cache / "xla").is_dir() else []
    # an executable (NAME-HASH-cache) per compiled program, the train step's among them
    assert any(n.startswith("jit_train_step-") and n.endswith("-cache") for n in runs["on"]), runs["on"]
    assert runs["off"] == []
