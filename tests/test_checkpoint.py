"""Orbax checkpoints: a resumed run continues bit-exactly (model, optimizer and data position); a
corrupt checkpoint or a changed config stops with a clear error and deletes nothing."""
import json
import shutil

import pytest

import train
from andrea_jax import config as config_lib, trainer

OVERRIDES = ["train.steps=6", "train.checkpoint_every=3", "train.log_every=1", "train.eval_every=3",
             "train.eval_batches=1", "train.sample_tokens=0", "train.batch_size=4",
             "model.n_layer=2", "model.d_model=32", "model.seq_len=16", "diagnostics.tensorboard=false"]


def cli(workdir, *extra):
    args = ["--config", "tiny", "--workdir", str(workdir)]
    for o in OVERRIDES + list(extra):
        args += ["--set", o]
    return train.main(args)


def losses(workdir):
    return [(l["step"], l["loss"], l.get("val_loss")) for l in map(json.loads, (workdir / "metrics.jsonl").open())]


def test_resume_continues_bit_exactly(tmp_path):
    cfg = config_lib.validate(config_lib.override(config_lib.load("tiny"), OVERRIDES))
    straight = tmp_path / "straight"
    trainer.train(cfg, straight, show_progress=False)
    assert sorted(p.name for p in (straight / "checkpoints").iterdir()) == ["3", "6"]

    # Simulate a run killed after its step-3 checkpoint: drop the last checkpoint, run again.
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "6")
    lines = trainer.train(cfg, resumed, show_progress=False)
    assert [l["step"] for l in lines] == [4, 5, 6]  # steps 1-3 were not trained again
    assert losses(resumed) == losses(straight)      # same losses, same validation, same data order


def test_corrupt_checkpoint_stops_with_its_name_and_is_kept(tmp_path, capsys):
    assert cli(tmp_path) == 0
    damaged = [f for f in (tmp_path / "checkpoints" / "6" / "state").rglob("*") if f.is_file() and f.parent.name == "d"]
    assert damaged
    for f in damaged:
        f.write_bytes(b"not a checkpoint")
    assert cli(tmp_path, "train.steps=9") == 1
    err = capsys.readouterr().err
    assert "checkpoint" in err and str(tmp_path / "checkpoints" / "6") in err and "cannot be restored" in err
    assert all(f.read_bytes() == b"not a checkpoint" for f in damaged)  # nothing deleted or rewritten


def test_changed_model_settings_refuse_to_resume(tmp_path, capsys):
    assert cli(tmp_path) == 0
    before = (tmp_path / "metrics.jsonl").read_text()
    assert cli(tmp_path, "model.n_layer=3") == 1
    assert "model.n_layer" in capsys.readouterr().err
    assert (tmp_path / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize("bad", ["train.checkpoint_every=-1", "train.keep_checkpoints=0"])
def test_checkpoint_settings_are_validated(bad, tmp_path, capsys):
    assert train.main(["--config", "tiny", "--workdir", str(tmp_path), "--set", bad]) == 2
    assert bad.split("=")[0] in capsys.readouterr().err
