"""train.deterministic: XLA's deterministic GPU kernels and no autotuning, set before jax starts."""
import os

import pytest

from andrea_jax import cli, config as config_lib, configs, startup
from andrea_jax.errors import ConfigError
from andrea_jax.train import loop

WANTED = "--xla_gpu_exclude_nondeterministic_ops=true --xla_gpu_autotune_level=0"
TOY = ["model.seq_len=16", "model.d_model=32", "model.n_layer=2", "model.n_head=2", "model.vocab_size=300",
       "train.batch_size=4", "train.steps=2", "train.eval_every=0", "train.sample_tokens=0",
       "train.checkpoint_every=0", "diagnostics.tensorboard=false"]


def test_the_flags_join_what_xla_flags_holds_and_a_contrary_setting_is_refused():
    assert startup.with_deterministic_flags("") == WANTED
    assert startup.with_deterministic_flags(" --xla_cpu_max_isa=AVX2 ") == "--xla_cpu_max_isa=AVX2 " + WANTED
    assert startup.with_deterministic_flags(WANTED) == WANTED
    assert startup.has_deterministic_flags(WANTED) and not startup.has_deterministic_flags("--xla_gpu_autotune_level=0")
    with pytest.raises(ConfigError, match="needs --xla_gpu_autotune_level=0, but XLA_FLAGS sets "
                                          "--xla_gpu_autotune_level=4"):
        startup.with_deterministic_flags("--xla_gpu_autotune_level=4")


def test_train_py_sets_the_flags_before_jax_starts_and_train_refuses_a_run_without_them(
        tmp_path, monkeypatch, capsys, tok_path):
    sets = [*TOY, f"data.tokenizer={tok_path}", "train.deterministic=true"]
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX2")
    argv = [a for s in sets for a in ("--set", s)]
    assert cli.main(["--config", "tiny", "--workdir", str(tmp_path / "cli"), *argv]) == 0
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_max_isa=AVX2 " + WANTED
    # called as a library after jax started without them, train() refuses rather than run undeterministically
    monkeypatch.delenv("XLA_FLAGS")
    cfg = config_lib.validate(config_lib.override(configs.load("tiny"), sets))
    with pytest.raises(ConfigError, match="train.deterministic=true: XLA_FLAGS lacks " + WANTED):
        loop.train(cfg, tmp_path / "library", show_progress=False)
    assert not (tmp_path / "library").exists()  # refused before the workdir is made
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=2")
    assert cli.main(["--config", "tiny", "--workdir", str(tmp_path / "contrary"), *argv]) == 2
    assert "config error: train.deterministic=true needs --xla_gpu_autotune_level=0" in capsys.readouterr().err
