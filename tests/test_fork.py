"""train.py --fork-from RUN@STEP: a WSD cooldown from a stable-phase checkpoint is the run planned
to end K steps after it, and the parent is never written."""
import hashlib
import json
import pathlib

import jax
import numpy as np
import pytest

from andrea_jax import cli, config as config_lib, configs
from andrea_jax.errors import ConfigError
from andrea_jax.serve import load
from andrea_jax.train import fork, optim

TOY = ["model.seq_len=16", "model.d_model=32", "model.n_layer=2", "model.n_head=2", "model.vocab_size=300",
       "train.batch_size=4", "train.log_every=1", "train.eval_every=0", "train.sample_tokens=0",
       "train.checkpoint_every=3", "train.keep_checkpoints=10", "diagnostics.tensorboard=false",
       "optim.schedule=wsd", "optim.warmup_steps=2", "optim.decay_fraction=0.25", "prores.schedule=linear",
       "prores.warmup=2"]


def sets(*extra):
    return [a for s in [*TOY, *extra] for a in ("--set", s)]


def tree_digest(folder: pathlib.Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def lines(run: pathlib.Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "lr" in r}


def test_a_fork_is_the_run_planned_to_end_k_steps_later_and_leaves_its_parent_alone(tmp_path, tok_path):
    tok = f"data.tokenizer={tok_path}"
    parent, forked, planned = tmp_path / "parent", tmp_path / "fork", tmp_path / "planned"
    # the parent: 12 steps, warmup 2, decay over the last 3: stable from step 2 to step 9
    assert cli.main(["--config", "tiny", "--workdir", str(parent), *sets(tok, "train.steps=12")]) == 0
    before = tree_digest(parent)
    assert cli.main(["--fork-from", f"{parent}@6", "--workdir", str(forked),
                     *sets(tok, "optim.decay_steps=4")]) == 0
    assert tree_digest(parent) == before
    saved = json.loads((forked / "config.json").read_text())
    assert saved["train"]["fork_from"] == f"{parent.resolve()}@6" and saved["train"]["steps"] == 10
    # the run planned from the start to end at 6 + 4 with a decay of 4
    assert cli.main(["--config", "tiny", "--workdir", str(planned),
                     *sets(tok, "train.steps=10", "optim.decay_steps=4")]) == 0
    want, got = lines(planned), lines(forked)
    assert sorted(got) == [7, 8, 9, 10]
    assert [got[s]["lr"] for s in got] == [want[s]["lr"] for s in got]
    assert [got[s]["loss"] for s in got] == [want[s]["loss"] for s in got]
    # identical weights at the fork's step, and after it
    for step in (6, 9):
        a, b = (jax.tree.leaves(load.load(workdir=r, step=step).params) for r in (forked, planned))
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    # the parent's LR at 7..9 was its stable peak; the fork's decays
    assert lines(parent)[7]["lr"] == lines(parent)[9]["lr"] > got[9]["lr"] > got[10]["lr"]


def test_decay_steps_set_the_wsd_decay_and_the_fork_is_refused_outside_the_stable_phase(tmp_path):
    cfg = config_lib.validate(config_lib.override(configs.load("tiny"), [*TOY, "optim.decay_steps=4"]))
    lr = optim.lr_schedule(cfg.optim, 10)
    peak = cfg.optim.lr
    assert [float(lr(t)) for t in (0, 2, 6)] == [0.0, pytest.approx(peak), pytest.approx(peak)]
    assert [float(lr(t)) for t in (7, 8, 9, 10)] == pytest.approx([0.75 * peak, 0.5 * peak, 0.25 * peak, 0.0])
    parent = config_lib.validate(config_lib.override(configs.load("tiny"), [*TOY, "train.steps=12"]))
    with pytest.raises(ConfigError, match="step 10 is outside the parent's stable phase, steps 2 to 9"):
        fork.planned_config(parent, 10, ["optim.decay_steps=4"], "P@10")
    with pytest.raises(ConfigError, match="needs a WSD parent and --set optim.decay_steps=K"):
        fork.planned_config(parent, 6, [], "P@6")
    with pytest.raises(ConfigError, match=r"settings these change: model.n_layer \(saved 2, now 3\)"):
        fork.planned_config(parent, 6, ["optim.decay_steps=4", "model.n_layer=3"], "P@6")
    with pytest.raises(ConfigError, match=r"optim.lr"):
        fork.planned_config(parent, 6, ["optim.decay_steps=4", "optim.lr=1e-2"], "P@6")
    with pytest.raises(ConfigError, match="RUN@STEP"):
        fork.parse("runs/a")
    with pytest.raises(ConfigError, match="is for optim.schedule=wsd"):
        config_lib.validate(config_lib.override(configs.load("tiny"), ["optim.decay_steps=4"]))
