"""Golden files written by earlier code (scripts/golden.py): the first 20 losses of a fixed tiny run
stay where they were, to a cross-machine tolerance, unless updated on purpose; every golden
checkpoint in tests/data is restored, its parameters bit for bit and its next step's loss, and a
checkpoint of a newer format version is refused in one line naming it."""
import json
import pathlib
import shutil
import sys

import numpy as np
import pytest

from andrea_jax import checkpoint
from andrea_jax.errors import CheckpointError

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
import golden  # noqa: E402

# The same 20-step run natively, under XLA_FLAGS=--xla_cpu_max_isa=AVX2 and =SSE4_2 differed by at
# most 9.5e-7 in a loss (~5.5, two float32 ulps); the bound leaves a margin of ~10x for other machines.
LOSS_ATOL = 1e-5
GOLDEN_CHECKPOINTS = sorted(golden.DATA.glob("golden_checkpoint_v*"))


def test_the_first_20_losses_of_a_fixed_tiny_run_stay_golden(tmp_path):
    saved = json.loads(golden.LOSSES.read_text())
    losses = golden.train_losses(saved["config"], tmp_path / "run")
    assert len(losses) == len(saved["losses"]) == golden.GOLDEN_STEPS
    moved = np.abs(np.array(losses) - np.array(saved["losses"]))
    print(f"golden losses: max abs difference {moved.max():.3g}")
    assert moved.max() <= LOSS_ATOL, (
        f"the first {golden.GOLDEN_STEPS} losses moved by up to {moved.max():.3g} (bound {LOSS_ATOL}) from "
        f"{golden.LOSSES}: if the change means to move them, write the file again with "
        f"`python scripts/golden.py losses` and commit it; now {losses}")


def test_there_is_a_golden_checkpoint_of_the_current_format_version():
    assert golden.DATA / f"golden_checkpoint_v{checkpoint.FORMAT_VERSION}" in GOLDEN_CHECKPOINTS, \
        "write it with `python scripts/golden.py checkpoint` and commit it"


@pytest.mark.parametrize("golden_dir", GOLDEN_CHECKPOINTS, ids=lambda p: p.name)
def test_a_golden_checkpoint_is_restored_and_trains_its_next_step(golden_dir, tmp_path):
    expected = json.loads((golden_dir / "expected.json").read_text())
    cfg = golden.run_config(json.loads((golden_dir / "config.json").read_text()))
    step_dir = golden_dir / "checkpoints" / str(expected["step"])
    assert checkpoint.format_version(step_dir) == expected["format_version"]
    assert golden.params_sha256(golden.read_params(step_dir, cfg)) == expected["params_sha256"]

    workdir = tmp_path / "run"
    shutil.copytree(golden_dir, workdir)
    lines = golden.trainer.train(cfg, workdir, show_progress=False)
    assert [line["step"] for line in lines] == [expected["step"] + 1]
    assert abs(lines[0]["loss"] - expected["next_loss"]) <= LOSS_ATOL, (lines[0]["loss"], expected["next_loss"])


# How a checkpoint is read: the trainer's resume, and read_params, through which export, generate and
# evaluate read the parameters.
READERS = {"trainer": lambda cfg, workdir, step_dir: golden.trainer.train(cfg, workdir, show_progress=False),
           "read_params": lambda cfg, workdir, step_dir: golden.read_params(step_dir, cfg)}


@pytest.mark.parametrize("reader", READERS)
def test_a_checkpoint_of_a_newer_format_version_is_refused_in_one_line(reader, tmp_path):
    golden_dir = golden.DATA / f"golden_checkpoint_v{checkpoint.FORMAT_VERSION}"
    workdir = tmp_path / "run"
    shutil.copytree(golden_dir, workdir)
    step_dir = workdir / "checkpoints" / "2"
    newer = checkpoint.FORMAT_VERSION + 1
    (step_dir / checkpoint.FORMAT / "metadata").write_text(json.dumps({checkpoint.VERSION_KEY: newer}))
    cfg = golden.run_config(json.loads((workdir / "config.json").read_text()))
    with pytest.raises(CheckpointError) as refused:
        READERS[reader](cfg, workdir, step_dir)
    assert str(refused.value) == (
        f"checkpoint {step_dir} is of format version {newer}, and this version of andrea_jax reads format "
        f"versions 1 to {checkpoint.FORMAT_VERSION}: read it with the version that wrote it, or use another workdir")
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2"]   # nothing trained or set aside


@pytest.mark.parametrize("version", [0, -1, True, "1", 1.0, None])
def test_a_format_item_that_names_no_readable_version_is_refused(version, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(golden.DATA / f"golden_checkpoint_v{checkpoint.FORMAT_VERSION}", workdir)
    step_dir = workdir / "checkpoints" / "2"
    item = {} if version is None else {checkpoint.VERSION_KEY: version}   # None: the key is missing
    (step_dir / checkpoint.FORMAT / "metadata").write_text(json.dumps(item))
    with pytest.raises(CheckpointError) as refused:
        checkpoint.format_version(step_dir)
    assert str(refused.value).startswith(f"checkpoint {step_dir} is of format version {version!r}, ")


def test_a_checkpoint_without_a_format_item_is_read_as_version_1(tmp_path):
    golden_dir = golden.DATA / "golden_checkpoint_v1"
    expected = json.loads((golden_dir / "expected.json").read_text())
    step_dir = tmp_path / "checkpoints" / str(expected["step"])
    shutil.copytree(golden_dir / "checkpoints" / str(expected["step"]), step_dir)
    shutil.rmtree(step_dir / checkpoint.FORMAT)   # as written before versions were recorded
    cfg = golden.run_config(json.loads((golden_dir / "config.json").read_text()))
    assert checkpoint.format_version(step_dir) == 1
    assert golden.params_sha256(golden.read_params(step_dir, cfg)) == expected["params_sha256"]
