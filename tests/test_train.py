"""Training end to end: the step learns, is deterministic, never recompiles for a new step, and the
CLI writes metrics.jsonl."""
import dataclasses
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train
from andrea_jax import config as config_lib, configs, model as model_lib
from andrea_jax.model import prores
from andrea_jax.train import steps, loop as trainer
from andrea_jax.config import Config, ModelConfig, OptimConfig, ProResConfig, TrainConfig

SMALL = Config(
    model=ModelConfig(vocab_size=300, seq_len=32, d_model=64, n_layer=2, n_head=4),
    prores=ProResConfig(schedule="linear", warmup=5),
    optim=OptimConfig(lr=3e-3, warmup_steps=5),
    train=TrainConfig(steps=80, batch_size=4),
)


def test_tiny_model_overfits_one_batch():
    cfg = SMALL
    mesh = steps.make_mesh()
    state = steps.create_state(cfg, jax.random.key(0), mesh)
    step = steps.make_train_step(cfg, mesh)
    batch = np.asarray(jax.random.randint(jax.random.key(1), (4, 33), 0, 300), np.int32)
    losses = []
    for _ in range(cfg.train.steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[0] > 5.0  # ~ln(300) at init
    assert losses[-1] < losses[0] / 5, losses[::10]
    assert int(state.step) == cfg.train.steps
    assert step._cache_size() == 1  # the step counter is traced: no recompilation per step


def test_a_restored_step_counter_reuses_the_compiled_step():
    mesh = steps.make_mesh()
    state = steps.create_state(SMALL, jax.random.key(0), mesh)
    step = steps.make_train_step(SMALL, mesh)
    batch = np.zeros((4, 33), np.int32)
    state, _ = step(state, batch)
    # A checkpoint gives the counter back as a strongly typed int32, as a fresh state holds it.
    restored = state.replace(step=jax.device_put(np.int32(int(state.step)), state.step.sharding))
    step(restored, batch)
    assert step._cache_size() == 1


def test_first_step_sees_alpha_zero_so_blocks_get_no_gradient():
    state = steps.create_state(SMALL, jax.random.key(0), steps.make_mesh())
    batch = jax.random.randint(jax.random.key(1), (4, 33), 0, 300)
    model = model_lib.Andrea(SMALL.model)
    # jitted, as the train step is: op by op, each of the model's operations would compile on its own
    grads = jax.jit(jax.grad(steps.loss_fn), static_argnums=1)(state.params, model, batch,
                                                               prores.run_alphas(SMALL, state.step))
    assert all(np.all(np.asarray(g) == 0) for g in jax.tree.leaves(grads["blocks"]))


def test_the_logged_lr_is_the_lr_the_update_applied():
    # ProRes off, no weight decay and one batch: the step-2 gradient equals the step-1 one (step 1's
    # LR is 0, so the parameters do not move), which makes Adam's step-2 update lr * g / (|g| + eps):
    # lr on every parameter whose gradient is far above eps.
    cfg = dataclasses.replace(SMALL, prores=ProResConfig(schedule="none"),
                              optim=dataclasses.replace(SMALL.optim, weight_decay=0.0))
    mesh = steps.make_mesh()
    state = steps.create_state(cfg, jax.random.key(0), mesh)
    step = steps.make_train_step(cfg, mesh)
    batch = np.asarray(jax.random.randint(jax.random.key(1), (4, 33), 0, 300), np.int32)
    host = lambda s: [np.asarray(a) for a in jax.tree.leaves(s.params)]
    params0 = host(state)
    state, first = step(state, batch)
    params1 = host(state)
    state, second = step(state, batch)
    moved = max(float(np.max(np.abs(b - a))) for a, b in zip(params1, host(state)))
    assert float(first["lr"]) == 0.0 and all(np.array_equal(a, b) for a, b in zip(params0, params1))
    assert float(second["lr"]) == pytest.approx(cfg.optim.lr / cfg.optim.warmup_steps, rel=1e-6)
    # measured moved / lr - 1 = 4.6e-6, natively and under AVX2 (float32 rounding of parameters and LR)
    assert moved == pytest.approx(float(second["lr"]), rel=1e-4)


def tiny_cli(workdir, *extra):
    # ProRes on (tiny ships it off) with T = 3: the alphas ramp until step 6, the last.
    return [sys.executable, "train.py", "--config", "tiny", "--workdir", str(workdir),
            "--set", "prores.schedule=linear", "--set", "prores.warmup=3",
            "--set", "train.steps=6", "--set", "train.log_every=2", "--set", "train.eval_every=3",
            "--set", "train.eval_batches=1", "--set", "train.sample_tokens=5",
            "--set", "model.n_layer=2", "--set", "model.d_model=64", "--set", "model.seq_len=32",
            *extra]


def test_cli_trains_and_writes_metrics(tmp_path):
    proc = subprocess.run(tiny_cli(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [2, 3, 4, 6]
    for line in lines:
        assert {"step", "loss", "lr", "tokens_per_sec"} <= set(line)
        assert np.isfinite(line["loss"]) and line["tokens_per_sec"] > 0
    assert [l["step"] for l in lines if "val_loss" in l] == [3, 6]
    assert (tmp_path / "tokenizer.json").exists()
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model"]["n_layer"] == 2
    assert saved["prores"] == {"schedule": "linear", "warmup": 3, "warmup_tokens": 0, "scale_updates": "none",
                               "forward": True}
    assert "ProRes linear T=3" in proc.stdout
    assert "--- sample ---" in proc.stdout


def test_same_seed_same_losses_other_seed_other_losses(tmp_path):
    cfg = config_lib.override(configs.load("tiny"), [
        "train.steps=4", "train.log_every=1", "train.eval_every=0", "train.sample_tokens=0",
        "model.n_layer=2", "model.d_model=32", "model.seq_len=16", "train.batch_size=4",
        "prores.schedule=linear", "prores.warmup=2"])  # alphas from [0, 0] at step 1 to [1, 0.75] at step 4
    run = lambda c, d: [l["loss"] for l in trainer.train(c, tmp_path / d, show_progress=False)]
    first, second = run(cfg, "a"), run(cfg, "b")
    assert first == second  # exact by construction: the same compiled step on the same batches
    other = run(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=1)), "c")
    assert other != first


def test_nan_loss_stops_with_a_clear_error(tmp_path, capsys):
    rc = train.main(["--config", "tiny", "--workdir", str(tmp_path), "--set", "optim.lr=1e30",
                     "--set", "optim.warmup_steps=0", "--set", "prores.schedule=none",
                     "--set", "train.steps=5", "--set", "train.log_every=1", "--set", "train.sample_tokens=0",
                     "--set", "model.n_layer=1", "--set", "model.d_model=32", "--set", "model.seq_len=16"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "non-finite loss" in err and "at step" in err
    assert (tmp_path / "metrics.jsonl").read_text()  # the steps before the failure are kept


def test_evaluation_reports_bits_per_byte_of_the_scored_text(tok_path):
    from andrea_jax.data import pipeline, tokenizer as tok_lib
    tok = tok_lib.load(tok_path)
    cfg = SMALL
    mesh = steps.make_mesh()
    state = steps.create_state(cfg, jax.random.key(0), mesh)
    ids = tok_lib.encode(tok, pipeline.read_text(pipeline.EMBEDDED_CORPUS)[:20_000])
    batches = [np.asarray(ids[i * 4 * 33:(i + 1) * 4 * 33], np.int32).reshape(4, 33) for i in range(3)]
    got = steps.evaluate(steps.make_eval_step(cfg, mesh), state.params, state.step, batches,
                         tok_lib.bytes_per_token(tok))
    # independently: the NLL of every target from the logits, the bytes from the decoded targets' text
    model = model_lib.Andrea(cfg.model)
    nll = 0.0
    for b in batches:
        logp = jax.nn.log_softmax(model.apply({"params": state.params}, b[:, :-1], prores.run_alphas(cfg, 0)).logits)
        nll -= float(jnp.take_along_axis(logp, b[:, 1:, None], axis=-1).sum())
    n_bytes = sum(len(tok_lib.decode(tok, row[1:]).encode("utf-8")) for b in batches for row in b)
    assert abs(got["val_loss"] - nll / (3 * 4 * 32)) < 1e-5
    assert abs(got["val_bpb"] - nll / np.log(2) / n_bytes) < 1e-5


@pytest.mark.compiled_at_o1  # a step and an evaluation of the whole model: -O0's code runs slower
def test_andrea_120m_on_the_embedded_corpus_stops_in_one_line_and_its_smoke_override_runs(tmp_path):
    base = [sys.executable, "train.py", "--config", "andrea_120m"]
    proc = subprocess.run(base + ["--workdir", str(tmp_path / "full")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("error: the training tokens make 293 windows")
    assert "--set train.batch_size=N with N <= 293" in proc.stderr
    # One row of 1024 tokens, one step and one validation batch (not the config's 8): in bfloat16 on a
    # CPU each pass of the whole model takes seconds per row, and one shows that training and evaluation run.
    smoke = ["--set", "train.batch_size=1", "--set", "train.steps=1", "--set", "train.checkpoint_every=0",
             "--set", "train.sample_tokens=0", "--set", "train.eval_every=0", "--set", "train.eval_batches=1"]
    proc = subprocess.run(base + ["--workdir", str(tmp_path / "smoke"), *smoke], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "92,331,264 parameters" in proc.stdout
    last = json.loads((tmp_path / "smoke" / "metrics.jsonl").read_text().splitlines()[-1])
    assert np.isfinite(last["loss"]) and np.isfinite(last["val_loss"])
