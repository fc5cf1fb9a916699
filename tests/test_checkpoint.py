"""Orbax checkpoints: a resumed run continues bit-exactly (model, optimizer, data position and the
per-step losses); an unreadable checkpoint is passed over for an older one and kept; changed
settings are refused by name unless they cannot change the run (or, for the schedule, unless
confirmed)."""
import json
import shutil

import numpy as np
import pytest

import train
from andrea_jax import config as config_lib, trainer

OVERRIDES = ["train.steps=6", "train.checkpoint_every=3", "train.log_every=1", "train.eval_every=3",
             "train.eval_batches=1", "train.sample_tokens=0", "train.batch_size=4", "model.vocab_size=300",
             "model.n_layer=2", "model.d_model=32", "model.seq_len=16", "diagnostics.tensorboard=false"]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def settings(tok_path):
    return OVERRIDES + [f"data.tokenizer={tok_path}"]


def cli(workdir, settings, *extra, flags=()):
    args = ["--config", "tiny", "--workdir", str(workdir), *flags]
    for o in settings + list(extra):
        args += ["--set", o]
    return train.main(args)


def losses(workdir):
    return [(l["step"], l["loss"], l["lr"], l["grad_norm"], l.get("val_loss"), l.get("spike_score"))
            for l in map(json.loads, (workdir / "metrics.jsonl").open())]


def test_resume_continues_bit_exactly(tmp_path, settings):
    cfg = config_lib.validate(config_lib.override(config_lib.load("tiny"), settings))
    straight = tmp_path / "straight"
    trainer.train(cfg, straight, show_progress=False)
    assert sorted(p.name for p in (straight / "checkpoints").iterdir()) == ["3", "6"]

    # Simulate a run killed after its step-3 checkpoint: drop the last checkpoint, run again. The
    # per-step losses come back from the checkpoint, not from step_losses.npy.
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "6")
    (resumed / "step_losses.npy").unlink()
    lines = trainer.train(cfg, resumed, show_progress=False)
    assert [l["step"] for l in lines] == [4, 5, 6]  # steps 1-3 were not trained again
    assert losses(resumed) == losses(straight)      # same losses, same validation, same data order
    np.testing.assert_array_equal(np.load(resumed / "step_losses.npy"), np.load(straight / "step_losses.npy"))


def damage(step_dir, how):
    files = [f for f in (step_dir / "state").rglob("*") if f.is_file() and f.parent.name == "d"]
    assert files
    for f in files:
        f.write_bytes(b"not a checkpoint" if how == "garbage" else f.read_bytes()[: len(f.read_bytes()) // 3])
    return {f: f.read_bytes() for f in files}


def test_unreadable_checkpoint_is_passed_over_and_kept(tmp_path, settings, capsys):
    assert cli(tmp_path, settings) == 0
    straight = losses(tmp_path)
    bad = damage(tmp_path / "checkpoints" / "6", "garbage")
    capsys.readouterr()

    assert cli(tmp_path, settings) == 0  # resumes from step 3 and trains steps 4-6 again
    err = capsys.readouterr().err
    assert str(tmp_path / "checkpoints" / "6") in err and "cannot be restored" in err
    assert f"resuming from {tmp_path / 'checkpoints' / '3'}" in err
    assert losses(tmp_path) == straight
    # The bad checkpoint stayed until step 6 was saved again, then was set aside, never deleted.
    aside = tmp_path / "checkpoints" / "6.unreadable"
    assert all((aside / f.relative_to(tmp_path / "checkpoints" / "6")).read_bytes() == b for f, b in bad.items())
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["3", "6", "6.unreadable"]

    # None readable (one cut short, one overwritten): stop, naming both, deleting nothing.
    damage(tmp_path / "checkpoints" / "3", "truncated")
    damage(tmp_path / "checkpoints" / "6", "garbage")
    assert cli(tmp_path, settings) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: no checkpoint of") and "can be restored" in err
    assert str(tmp_path / "checkpoints" / "6") in err and str(tmp_path / "checkpoints" / "3") in err
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["3", "6", "6.unreadable"]


def test_only_settings_that_change_the_run_are_refused(tmp_path, settings, capsys):
    assert cli(tmp_path, settings) == 0
    before = (tmp_path / "metrics.jsonl").read_text()
    capsys.readouterr()

    assert cli(tmp_path, settings, "model.n_layer=3", "train.seed=1") == 1
    err = capsys.readouterr().err
    assert "model.n_layer (saved 2, now 3)" in err and "train.seed (saved 0, now 1)" in err
    assert cli(tmp_path, settings, "train.steps=9") == 1  # re-stretches the LR schedule: confirm it
    err = capsys.readouterr().err
    assert "train.steps (saved 6, now 9)" in err and "--allow-schedule-change" in err
    assert (tmp_path / "metrics.jsonl").read_text() == before and not (tmp_path / "checkpoints" / "9").exists()

    # Where data is stored, remat and the logging cadence are free; the confirmed schedule is taken.
    assert cli(tmp_path, settings, "train.steps=9", "model.remat=true", f"data.data_dir={tmp_path / 'tfds'}",
               "train.log_every=3", flags=["--allow-schedule-change"]) == 0
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [1, 2, 3, 4, 5, 6, 9]  # resumed at step 6
    assert json.loads((tmp_path / "config.json").read_text())["train"]["steps"] == 9


@pytest.mark.parametrize("bad", ["train.checkpoint_every=-1", "train.keep_checkpoints=0",
                                 "optim.max_consecutive_skips=0"])
def test_checkpoint_settings_are_validated(bad, tmp_path, capsys):
    assert train.main(["--config", "tiny", "--workdir", str(tmp_path), "--set", bad]) == 2
    assert bad.split("=")[0] in capsys.readouterr().err
