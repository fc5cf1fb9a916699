"""optim.ema: a moving average of the parameters in the optimizer state, evaluated beside them and
exported with --weights ema."""
import json

import jax
import numpy as np
import optax
import pytest

from andrea_jax import config as config_lib, configs, workdir
from andrea_jax.errors import LoadError
from andrea_jax.serve import export, load
from andrea_jax.train import optim, steps

DECAY = 0.9


def test_the_average_follows_the_parameters_each_update_produces():
    tx = optim.params_ema(optax.sgd(0.5), DECAY)
    params = {"w": np.array([1.0, -2.0], np.float32)}
    state, want = tx.init(params), np.array([1.0, -2.0])
    for grad in ([1.0, 0.0], [0.5, -1.0], [0.0, 2.0]):
        updates, state = tx.update({"w": np.array(grad, np.float32)}, state, params)
        np.testing.assert_array_equal(updates["w"], -0.5 * np.array(grad, np.float32))  # sgd's, unchanged
        params = optax.apply_updates(params, updates)
        want = DECAY * want + (1 - DECAY) * np.asarray(params["w"], np.float64)
        # float32 recursion against a float64 one: measured 1.2e-7 relative at most (CPU, jax 0.10.2)
        np.testing.assert_allclose(optim.ema_params(state)["w"], want, rtol=1e-6)


def test_the_train_step_keeps_the_average_of_its_parameters_sharded_like_them():
    cfg = config_lib.validate(config_lib.override(configs.load("tiny"), [
        "model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.seq_len=16", "model.vocab_size=300",
        "train.batch_size=4", "train.steps=4", f"optim.ema={DECAY}"]))
    mesh = steps.make_mesh(cfg)
    state = steps.create_state(cfg, jax.random.key(0), mesh)
    want = jax.tree.map(lambda p: np.asarray(p, np.float64), state.params)
    step = steps.make_train_step(cfg, mesh)
    for i in range(3):
        batch = np.random.default_rng(i).integers(0, 300, (4, 17), dtype=np.int32)
        state, _ = step(state, jax.device_put(batch, steps.batch_sharding(cfg, mesh)))
        want = jax.tree.map(lambda w, p: DECAY * w + (1 - DECAY) * np.asarray(p, np.float64), want, state.params)
    ema = optim.ema_params(state.opt_state)
    for got, w, p in zip(jax.tree.leaves(ema), jax.tree.leaves(want), jax.tree.leaves(state.params)):
        # float32 average against a float64 one: measured 1.5e-7 absolute at most (CPU, jax 0.10.2)
        np.testing.assert_allclose(np.asarray(got), w, rtol=1e-5, atol=1e-6)
        assert got.sharding == p.sharding


def test_a_run_with_ema_evaluates_and_exports_the_average(trained_run, tmp_path):
    run = trained_run(f"optim.ema={DECAY}")
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"val_loss", "val_loss_ema", "val_bpb_ema"} <= set(last) and last["val_loss_ema"] != last["val_loss"]
    raw, averaged = load.load(workdir=run), load.load(workdir=run, weights="ema")
    assert averaged.step == raw.step and "(ema)" in averaged.source
    leaves = list(zip(jax.tree.leaves(raw.params), jax.tree.leaves(averaged.params)))
    assert any(not np.array_equal(a, b) for a, b in leaves)
    out = tmp_path / "e"
    assert export.main(["--workdir", str(run), "--weights", "ema", "--format", "native", "--out", str(out)]) == 0
    exported = load.load(export=out)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(exported.params), jax.tree.leaves(averaged.params)))
    with pytest.raises(LoadError, match="needs a run trained with optim.ema > 0"):
        load.load(workdir=trained_run(), weights="ema")


def test_switching_the_average_on_or_off_is_another_run_but_its_decay_may_change():
    before = config_lib.override(configs.load("tiny"), ["optim.ema=0.9"]).to_dict()
    for now, identity in (("optim.ema=0", True), ("optim.ema=0.99", False)):
        changed, _ = workdir.changed_settings(before, config_lib.override(configs.load("tiny"), [now]).to_dict())
        assert bool(changed) == identity, changed
