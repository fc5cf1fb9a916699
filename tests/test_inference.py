"""The inference loader: the newest or a chosen checkpoint's parameters (and nothing else), placed
on the current devices, equal to what training saved; one-line errors that name the path."""
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from andrea_jax.serve import load
from andrea_jax import model as model_lib


def saved_state(run, step):
    """The whole train state of a checkpoint, read independently of the loader."""
    with ocp.PyTreeCheckpointer() as ckptr:
        return ckptr.restore(run / "checkpoints" / str(step) / "state")


def test_loads_the_newest_or_a_chosen_checkpoint_params_only(trained_run):
    run = trained_run()
    newest, older = load.load(workdir=run), load.load(workdir=run, step=3)
    assert (newest.step, older.step) == (6, 3)
    assert newest.cfg.model.n_layer == 3 and newest.tokenizer.get_vocab_size() == 300
    np.testing.assert_array_equal(newest.alphas(), [1.0, 0.75, 0.5])
    for loaded, step in ((newest, 6), (older, 3)):
        want = saved_state(run, step)["params"]
        assert jax.tree.structure(loaded.params) == jax.tree.structure(model_lib.param_shapes(loaded.cfg.model))
        for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(want)):
            np.testing.assert_array_equal(a, b)
            assert a.sharding.device_set == set(jax.devices())
    assert not np.array_equal(newest.params["lnf_bias"], older.params["lnf_bias"])


def test_missing_or_unreadable_checkpoints_give_one_line_naming_the_path(trained_run, tmp_path):
    with pytest.raises(load.LoadError, match=f"^{tmp_path / 'nope'}: no such run folder$"):
        load.load(workdir=tmp_path / "nope")
    run = tmp_path / "copy"
    shutil.copytree(trained_run(), run)
    with pytest.raises(load.LoadError, match=r"checkpoints/4: no such checkpoint; steps kept: 3, 6$"):
        load.load(workdir=run, step=4)
    for f in (run / "checkpoints" / "6" / "state").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(b"garbage")  # the array data of step 6
    with pytest.raises(load.LoadError) as err:
        load.load(workdir=run)
    message = str(err.value)
    assert message.startswith(f"{run / 'checkpoints' / '6'}: checkpoint cannot be read") and "\n" not in message
    assert load.load(workdir=run, step=3).step == 3  # the others stay usable
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(load.LoadError, match="no checkpoint to load"):
        load.load(workdir=run)


def test_native_export_reads_back_bit_exactly(trained_run, tmp_path):
    loaded = load.load(workdir=trained_run("model.gates=learned"))
    load.save_native(loaded, tmp_path / "native")
    back = load.load(export=tmp_path / "native")
    assert back.step == loaded.step and back.cfg == loaded.cfg
    assert back.tokenizer.to_str() == loaded.tokenizer.to_str()
    for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(back.params)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    with pytest.raises(load.LoadError, match="not a native export"):
        load.load(export=trained_run())


def test_a_relative_workdir_loads(trained_run, monkeypatch):
    run = trained_run()
    monkeypatch.chdir(run.parent)
    assert load.load(workdir=run.name).step == 6  # orbax itself takes absolute paths only
