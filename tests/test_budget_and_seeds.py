"""A run's length as a budget (train.tokens, train.flops: resolved once into train.steps, recorded
in config.json, kept on resume) and the data order's seed apart from the init's (train.data_seed)."""
import dataclasses
import json

import jax
import numpy as np
import pytest

from andrea_jax import cli, config as config_lib, configs, workdir
from andrea_jax.data import loader, pipeline
from andrea_jax.errors import ConfigError, ResumeError
from andrea_jax.train import budget, loop

# A step trains batch_size x seq_len = 4 x 32 = 128 tokens.
TOY = ["train.batch_size=4", "model.seq_len=32", "model.d_model=32", "model.n_layer=3", "model.n_head=4",
       "model.vocab_size=300"]


def toy(*sets):
    return config_lib.validate(config_lib.override(configs.load("tiny"), [*TOY, *sets]))


# --- budgets -------------------------------------------------------------------------------------

@pytest.mark.parametrize("tokens, steps", [(1, 1), (128, 1), (129, 2), (1000, 8), (1024, 8), (1025, 9)])
def test_tokens_give_the_steps_that_train_at_least_them_rounding_up(tokens, steps):
    # 1000 / 128 = 7.8125: 7 steps would train 896 tokens, short of the budget; 8 train 1024
    cfg = budget.resolve(toy(f"train.tokens={tokens}"))
    assert cfg.train.steps == steps and cfg.train.tokens == tokens


def hand_flops_per_token(D, L, F, V, T, mlp_matrices):
    """mfu's count written out: 6 x the matmul weights a token meets (q, k, v, out; the MLP's;
    the logits over V) + causal attention's 6 L D (T + 1)."""
    return 6 * (L * (4 * D * D + mlp_matrices * D * F) + V * D) + 6 * L * D * (T + 1)


@pytest.mark.parametrize("family, per_token", [("gpt2", 297_792), ("llama", 371_520)])
def test_flops_give_steps_at_the_mfu_count_of_flops_per_token(family, per_token):
    assert hand_flops_per_token(32, 3, 4 * 32, 300, 32, 3 if family == "llama" else 2) == per_token
    per_step = per_token * 128
    for flops, steps in ((10 * per_step, 10), (10 * per_step + 1, 11), (per_step / 2, 1)):
        cfg = budget.resolve(toy(f"model.family={family}", f"train.flops={flops!r}"))
        assert cfg.train.steps == steps, (flops, cfg.train.steps)
    line = budget.describe(budget.resolve(toy(f"model.family={family}", f"train.flops={10 * per_step}")))
    assert f"train.steps=10 of 128 tokens (train.batch_size x model.seq_len), 1,280 tokens, {10 * per_step:.4g}" in line


def test_without_a_budget_train_steps_stands():
    cfg = toy("train.steps=37")
    assert budget.resolve(cfg, explicit=["train.steps=37"]) is cfg and budget.describe(cfg) == ""


@pytest.mark.parametrize("sets, key", [
    (["train.tokens=1000", "train.flops=1e12"], "train.flops"),
    (["train.tokens=-5"], "train.tokens"),
    (["train.flops=-1e12"], "train.flops"),
    (["train.flops=inf"], "train.flops"),
    (["train.data_seed=-2"], "train.data_seed"),
])
def test_a_conflicting_or_negative_setting_is_refused_naming_its_key(sets, key):
    with pytest.raises(ConfigError, match=f"^{key}:"):
        toy(*sets)


def test_train_steps_set_beside_a_budget_is_refused_but_a_config_files_steps_are_replaced():
    cfg = toy("train.tokens=1000")  # tiny's file sets train.steps=600: the budget replaces it
    assert cfg.train.steps == 600 and budget.resolve(cfg).train.steps == 8
    with pytest.raises(ConfigError, match="^train.steps: set beside train.tokens=1000"):
        budget.resolve(cfg, explicit=["train.tokens=1000", "train.steps=5"])


def test_the_command_refuses_a_conflict_before_anything_starts(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["--config", "tiny", "--workdir", str(run), "--set", "train.tokens=1000", "--set", "train.steps=5"]
    assert cli.main(argv) == 2
    assert "config error: train.steps: set beside train.tokens=1000" in capsys.readouterr().err
    assert cli.main(["--config", "tiny", "--workdir", str(run), "--set", "train.tokens=1000",
                     "--set", "train.flops=1e12"]) == 2
    assert "config error: train.flops: set only one of" in capsys.readouterr().err
    assert not run.exists()  # refused before the loop made the workdir, long before a compile


def test_a_resume_keeps_the_recorded_steps_of_the_same_budget(tmp_path):
    cfg = toy("train.tokens=1000")
    first = budget.resolve(cfg, workdir=tmp_path)
    (tmp_path / workdir.CONFIG).write_text(json.dumps(first.to_dict()))
    again = budget.resolve(cfg, workdir=tmp_path)
    assert again == first and workdir.changed_settings(first.to_dict(), again.to_dict()) == ([], [])
    workdir.check(tmp_path, again, allow_schedule_change=False)
    more = budget.resolve(toy("train.tokens=2000"), workdir=tmp_path)
    with pytest.raises(ResumeError, match=r"train.steps \(saved 8, now 16\)"):
        workdir.check(tmp_path, more, allow_schedule_change=False)

    # What was recorded wins over resolving again (say the FLOP count's formula changed since) ...
    saved = first.to_dict()
    saved["train"]["steps"] = 9
    (tmp_path / workdir.CONFIG).write_text(json.dumps(saved))
    assert budget.resolve(cfg, workdir=tmp_path).train.steps == 9
    # ... but only for the same budget, batch and model
    assert budget.resolve(toy("train.tokens=1000", "train.batch_size=8"), workdir=tmp_path).train.steps == 4
    assert budget.resolve(toy("train.tokens=1000", "model.n_layer=2"), workdir=tmp_path).train.steps == 8
    (tmp_path / workdir.CONFIG).write_text("{not json")
    assert budget.resolve(cfg, workdir=tmp_path).train.steps == 8


def test_a_budgeted_run_trains_its_steps_and_records_them_with_the_budget(tmp_path, capsys, tok_path):
    run = tmp_path / "run"
    sets = ["model.seq_len=16", "model.d_model=32", "model.n_layer=2", "model.n_head=2", "model.vocab_size=300",
            "train.batch_size=4", "train.tokens=300", "train.log_every=1", "train.eval_every=0",
            "train.sample_tokens=0", "diagnostics.tensorboard=false", f"data.tokenizer={tok_path}"]
    assert cli.main(["--config", "tiny", "--workdir", str(run), *[a for s in sets for a in ("--set", s)]]) == 0
    # 300 tokens / (4 x 16 = 64 a step) = 4.69: 5 steps
    assert "train.tokens=300: train.steps=5 of 64 tokens" in capsys.readouterr().out
    saved = json.loads((run / workdir.CONFIG).read_text())["train"]
    assert (saved["steps"], saved["tokens"], saved["flops"]) == (5, 300, 0.0)
    assert [json.loads(line)["step"] for line in (run / workdir.METRICS).read_text().splitlines()] == [1, 2, 3, 4, 5]

    # The same budget passes the resume's check of train.steps; another data order is refused by the
    # same check, before any data is read: it is part of what a run is
    argv = ["--config", "tiny", "--workdir", str(run), *[a for s in [*sets, "train.data_seed=7"] for a in ("--set", s)]]
    assert cli.main(argv) == 1
    assert "other settings: train.data_seed (saved -1, now 7)" in capsys.readouterr().err


# --- seeds ---------------------------------------------------------------------------------------

class _Started(Exception):
    pass


build, create_state = pipeline.build, loop.create_state  # before any test patches them


def started(cfg, where, monkeypatch):
    """(the first 3 batches, the initial parameters) of loop.train's run of `cfg`, stopped once the
    state is made (nothing compiles but the init)."""
    seen = {}

    def build_and_read(*args, **kwargs):
        corpus, batches, val = build(*args, **kwargs)
        seen["batches"] = [next(batches) for _ in range(3)]
        return corpus, batches, val

    def create_and_stop(*args, **kwargs):
        seen["params"] = jax.device_get(create_state(*args, **kwargs).params)
        raise _Started

    monkeypatch.setattr(pipeline, "build", build_and_read)
    monkeypatch.setattr(loop, "create_state", create_and_stop)
    with pytest.raises(_Started):
        loop.train(cfg, where, show_progress=False)
    return seen["batches"], seen["params"]


def same_tree(a, b) -> bool:
    return all(jax.tree.leaves(jax.tree.map(np.array_equal, a, b)))


def test_data_seed_unset_is_train_seed_and_each_seed_moves_only_its_own_part(tmp_path, tok_path, monkeypatch):
    base = toy("train.seed=3", f"data.tokenizer={tok_path}", "diagnostics.tensorboard=false")
    with_seeds = lambda **train: config_lib.validate(
        dataclasses.replace(base, train=dataclasses.replace(base.train, **train)))
    batches, params = started(base, tmp_path / "a", monkeypatch)

    # Unset, the order is train.seed's, bit for bit as the loader gives it for that seed
    corpus = pipeline.tokenized_corpus(base.data, vocab_size=300, seq_len=32)
    before = loader.train_dataset(corpus.train_tokens, seq_len=32, global_batch=4, seed=3)
    assert all(np.array_equal(batches[k], before[k]) for k in range(3))
    assert pipeline.fingerprint(base, corpus)["seed"] == 3  # a checkpoint saved before data_seed still resumes
    same_batches, same_params = started(with_seeds(data_seed=3), tmp_path / "b", monkeypatch)
    assert all(np.array_equal(x, y) for x, y in zip(batches, same_batches)) and same_tree(params, same_params)

    # Another data seed: other batches, the same initial parameters
    other_batches, other_data_params = started(with_seeds(data_seed=4), tmp_path / "c", monkeypatch)
    assert not any(np.array_equal(x, y) for x, y in zip(batches, other_batches))
    assert same_tree(params, other_data_params)

    # Another init seed with the data seed held: the same batches, other initial parameters
    held_batches, other_params = started(with_seeds(seed=4, data_seed=3), tmp_path / "d", monkeypatch)
    assert all(np.array_equal(x, y) for x, y in zip(batches, held_batches))
    assert not same_tree(params, other_params)
