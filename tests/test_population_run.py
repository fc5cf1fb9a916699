"""andrea_jax.train.population_loop: a population trained as its members' solo runs are. Each member's
folder holds what a solo run's holds (its config, lines with the solo lines' keys, solo-format
checkpoints that load and resume as a solo run's); a member forced non-finite is frozen and marked
so while the others train on; a population stopped by SIGTERM resumes bit for bit."""
import json
import shutil
import signal

import jax
import numpy as np
import pytest

from _helpers import damage
from andrea_jax import config as config_lib, configs
from andrea_jax.errors import ResumeError
from andrea_jax.repro import runner
from andrea_jax.serve import load
from andrea_jax.train import hooks, loop, population, population_loop, preemption, steps
from andrea_jax.workdir import Workdir

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 1e39: float32's inf

STEPS = 8
COMMON = ["train.eval_batches=1", "train.batch_size=4", "train.sample_tokens=0", "model.n_layer=2", "model.d_model=32",
          "model.seq_len=16", "model.vocab_size=300", "diagnostics.tensorboard=false", f"train.steps={STEPS}",
          "train.log_every=1", "train.eval_every=4", "train.checkpoint_every=4", "diagnostics.every=4",
          "diagnostics.spike_window=2", "prores.schedule=linear", "train.data_seed=0"]
MEMBERS = {"a": ["train.seed=0", "optim.lr=3e-3", "prores.warmup=2"],
           "b": ["train.seed=1", "optim.lr=1e-2", "prores.warmup=3", "prores.scale_updates=alpha",
                 "optim.weight_decay=0.0", "optim.warmup_steps=2"],
           "frozen": ["train.seed=2", "optim.lr=1e39", "prores.warmup=2"]}  # an infinite LR: frozen at step 1
# A line without what the clock gives.
UNTIMED = lambda line: {k: v for k, v in line.items() if k not in ("tokens_per_sec", "mfu")}
# Measured against solo runs of members a and b over the 8 steps, the same natively and under
# XLA_FLAGS=--xla_cpu_max_isa=AVX2: losses and validation losses within 4.8e-7, gradient norms 1.2e-7,
# final parameters 1.5e-6 (a) and 3.2e-6 (b); member b resumed alone from step 4, its losses within 4.8e-7.
# The vmapped program rounds unlike the solo one (tests/test_population.py).
TOLERANCE = 2e-5


def members(tok_path) -> list:
    base = configs.load("tiny")
    return [(name, config_lib.validate(config_lib.override(base, [*COMMON, f"data.tokenizer={tok_path}", *sets])))
            for name, sets in MEMBERS.items()]


def lines(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def final_params(folder):
    return jax.device_get(load.load_workdir(folder).params)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tok_path):
    """The population trained without a stop: its workdir, its members and what train() returned."""
    workdir = tmp_path_factory.mktemp("population")
    cfgs = members(tok_path)
    return workdir, cfgs, population_loop.train(cfgs, workdir, show_progress=False)


def test_each_member_folder_is_a_solo_run_of_its_config(straight, tmp_path, capsys):
    workdir, cfgs, returned = straight
    for name, cfg in cfgs:
        folder = workdir / name
        assert json.loads((folder / "config.json").read_text()) == cfg.to_dict()
        assert Workdir(folder).checkpoint_steps() == [4, 8] and (folder / "tokenizer.json").is_file()
        assert [l["step"] for l in lines(folder)] == list(range(1, STEPS + 1))
        assert json.dumps(returned[name]) == json.dumps(lines(folder))  # NaN: the frozen member's LR
        assert len(np.load(folder / "step_losses.npy")) == STEPS
    assert all(l["frozen"] == 0 for name in ("a", "b") for l in lines(workdir / name))
    assert all(l["frozen"] == 1 for l in lines(workdir / "frozen"))  # and its folder says diverged
    assert runner._classify(workdir / "frozen", 0, STEPS) == "diverged"
    assert runner._classify(workdir / "b", 0, STEPS) == "finished"
    frozen_at_init = final_params(workdir / "frozen")  # it never moved, and its checkpoint loads
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(frozen_at_init))

    name, cfg = cfgs[1]
    loop.train(cfg, tmp_path / "solo", show_progress=False)
    solo, member = lines(tmp_path / "solo"), lines(workdir / name)
    assert [set(UNTIMED(l)) | {"frozen"} for l in solo] == [set(UNTIMED(l)) for l in member]
    assert any("layer_grad_norm" in l for l in member) and "val_loss" in member[-1]
    for key in ("loss", "val_loss", "grad_norm"):
        np.testing.assert_allclose([l.get(key, 0) for l in member], [l.get(key, 0) for l in solo], atol=TOLERANCE)
    # the traced schedule (population.lr_at) against optax's: measured 2.9e-7 relative, natively and under AVX2
    np.testing.assert_allclose([l["lr"] for l in member], [l["lr"] for l in solo], rtol=1e-6)
    params, solo_params = final_params(workdir / name), final_params(tmp_path / "solo")
    assert max(float(np.max(np.abs(x - y))) for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(solo_params))) \
        <= TOLERANCE

    # The member's step-4 checkpoint resumes as a solo run: it ends where the member ended.
    alone = tmp_path / "alone"
    shutil.copytree(workdir / name, alone)
    shutil.rmtree(alone / "checkpoints" / "8")
    capsys.readouterr()
    loop.train(cfg, alone, show_progress=False)
    assert "resumed at step 4" in capsys.readouterr().out
    np.testing.assert_allclose([l["loss"] for l in lines(alone)], [l["loss"] for l in member], atol=TOLERANCE)


def test_a_population_stopped_by_sigterm_resumes_bit_for_bit(straight, tmp_path, capsys):
    workdir, cfgs, _ = straight
    sent = []

    def sigterm(ctx, state, step, line) -> dict:
        if not sent:  # once, not once per member: a second signal ends the process
            sent.append(step)
            signal.raise_signal(signal.SIGTERM)
        return {}

    with pytest.raises(preemption.Stopped) as stopped:  # the signal comes during step 5's hooks
        population_loop.train(cfgs, tmp_path, show_progress=False,
                              extra_hooks=(hooks.Hook("sigterm", lambda step: step == 5, sigterm),))
    assert stopped.value.step == 6 and sent == [5]   # stopped after the next step, with its checkpoint
    assert all(Workdir(tmp_path / name).checkpoint_steps() == [4, 6] for name, _ in cfgs)
    population_loop.train(cfgs, tmp_path, show_progress=False)
    assert "resumed at step 6" in capsys.readouterr().out
    for name, _ in cfgs:
        assert [UNTIMED(l) for l in lines(tmp_path / name)] == [UNTIMED(l) for l in lines(workdir / name)], name
        np.testing.assert_array_equal(np.load(tmp_path / name / "step_losses.npy"),
                                      np.load(workdir / name / "step_losses.npy"))
        for x, y in zip(jax.tree.leaves(final_params(tmp_path / name)), jax.tree.leaves(final_params(workdir / name))):
            np.testing.assert_array_equal(x, y)


def test_a_population_resumes_at_the_newest_step_every_member_holds(straight, tmp_path, capsys):
    workdir, cfgs, _ = straight
    shutil.copytree(workdir, tmp_path / "population")
    shutil.rmtree(tmp_path / "population" / "a" / "checkpoints" / str(STEPS))  # a holds step 4 only; the others 4, 8
    population_loop.train(cfgs, tmp_path / "population", show_progress=False)
    assert "resumed at step 4" in capsys.readouterr().out
    for name, _ in cfgs:
        assert [UNTIMED(l) for l in lines(tmp_path / "population" / name)] == \
            [UNTIMED(l) for l in lines(workdir / name)], name
        for x, y in zip(jax.tree.leaves(final_params(tmp_path / "population" / name)),
                        jax.tree.leaves(final_params(workdir / name))):
            np.testing.assert_array_equal(x, y)


def test_a_member_resumed_under_other_settings_is_refused_naming_them(straight, tmp_path):
    workdir, cfgs, _ = straight
    shutil.copytree(workdir, tmp_path / "population")
    changed = [(name, config_lib.override(cfg, ["train.seed=5"]) if name == "b" else cfg) for name, cfg in cfgs]
    with pytest.raises(ResumeError, match=r"train.seed \(saved 1, now 5\)"):
        population_loop.train(changed, tmp_path / "population", show_progress=False)
    assert [UNTIMED(l) for l in lines(tmp_path / "population" / "b")] == [UNTIMED(l) for l in lines(workdir / "b")]


def test_a_common_step_one_member_cannot_read_falls_back_to_the_previous_one(straight, tmp_path, capsys):
    workdir, cfgs, _ = straight
    shutil.copytree(workdir, tmp_path / "population")
    damage(tmp_path / "population" / "a" / "checkpoints" / str(STEPS), "garbage")
    population_loop.train(cfgs, tmp_path / "population", show_progress=False)
    out, err = capsys.readouterr()
    assert "trying the members' previous common step" in err and "resumed at step 4" in out
    for name, _ in cfgs:
        assert [UNTIMED(l) for l in lines(tmp_path / "population" / name)] == \
            [UNTIMED(l) for l in lines(workdir / name)], name


def test_a_member_whose_step_stopped_short_of_the_checkpoint_is_restored_frozen(straight):
    _, cfgs, _ = straight
    cfgs = [cfg for _, cfg in cfgs]
    mesh = steps.make_mesh(cfgs[0])
    solo = [steps.create_state(cfg, jax.random.key(0), mesh).replace(step=jax.numpy.int32(s))
            for cfg, s in zip(cfgs, (4, 4, 1))]
    stacked = population_loop._stacked(cfgs[0], mesh, population.create_states(cfgs, mesh).settings, solo, 4)
    assert np.asarray(stacked.frozen).tolist() == [False, False, True]
    assert np.asarray(stacked.step).tolist() == [4, 4, 1]
