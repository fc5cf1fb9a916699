"""Stopping and resuming real train.py processes: SIGTERM checkpoints and exits, the rerun gives the
losses of an uninterrupted run bit for bit; a busy workdir is refused, a dead run's lock taken over;
processes of a multi-process run stop together, and checkpoints move between process counts. Also
non-finite losses: reported at their own step and never checkpointed, or skipped when asked."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import portpicker
import pytest

from andrea_jax import config as config_lib, inference, trainer
from test_multihost import ROOT, metric_lines

TOY = ["train.eval_batches=1", "train.batch_size=4", "train.sample_tokens=0", "model.n_layer=2",
       "model.d_model=32", "model.seq_len=16", "diagnostics.tensorboard=false"]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))


def command(workdir, settings, *flags):
    cmd = [sys.executable, str(ROOT / "train.py"), "--config", "tiny", "--workdir", str(workdir), *flags]
    for s in settings:
        cmd += ["--set", s]
    return cmd


def start(workdir, settings, *flags, log_name="log", env=None):
    """A train.py process writing its stdout and stderr to files (a full pipe would block it)."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = (workdir.parent / f"{workdir.name}.{log_name}").open("w")
    env = {**os.environ, "XLA_FLAGS": "", **(env or {})}  # one CPU device per process
    proc = subprocess.Popen(command(workdir, settings, *flags), stdout=out, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT)
    proc.log = out.name
    return proc


def finish(proc, timeout=300) -> str:
    proc.wait(timeout=timeout)
    return open(proc.log).read()


def wait_for_a_line(proc, prefix, timeout=200):
    deadline = time.monotonic() + timeout
    while not any(l.startswith(prefix) for l in open(proc.log).read().splitlines()):
        assert time.monotonic() < deadline and proc.poll() is None, open(proc.log).read()[-2000:]
        time.sleep(0.01)


def wait_for_a_metric_line(workdir, procs, timeout=200):
    deadline = time.monotonic() + timeout
    path = workdir / "metrics.jsonl"
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, "no metric line in time"
        assert all(p.poll() is None for p in procs), [open(p.log).read()[-2000:] for p in procs]
        time.sleep(0.01)


def same_run(a, b, *, exact=True):
    """Metric lines and per-step losses of two workdirs agree (bit for bit, or to float rounding)."""
    keys = ("step", "loss", "lr", "grad_norm", "val_loss", "spike_score")
    la, lb = metric_lines(a), metric_lines(b)
    assert [l["step"] for l in la] == [l["step"] for l in lb]
    sa, sb = np.load(a / "step_losses.npy"), np.load(b / "step_losses.npy")
    if exact:
        assert [[l.get(k) for k in keys] for l in la] == [[l.get(k) for k in keys] for l in lb]
        np.testing.assert_array_equal(sa, sb)
    else:
        # Another process count sums the all-reduce in another order: measured 1.7e-7 relative.
        for k in ("loss", "grad_norm", "val_loss"):
            np.testing.assert_allclose([l.get(k, 0) for l in la], [l.get(k, 0) for l in lb], rtol=2e-6)
        np.testing.assert_allclose(sa, sb, rtol=2e-6)


def test_sigterm_checkpoints_and_the_rerun_continues_exactly(tmp_path, tok_path):
    settings = TOY + ["train.steps=300", "train.log_every=5", "train.eval_every=100", "train.checkpoint_every=100",
                      "model.vocab_size=300", f"data.tokenizer={tok_path}"]
    env = {"ANDREA_CACHE": str(tmp_path / "cache")}
    straight = start(tmp_path / "straight", settings, env=env)
    run = start(tmp_path / "run", settings, env=env)
    wait_for_a_metric_line(tmp_path / "run", [run])
    os.kill(run.pid, signal.SIGSTOP)  # hold it mid-run, lock held
    try:
        second = subprocess.run(command(tmp_path / "run", settings), capture_output=True, text=True, cwd=ROOT,
                                env={**os.environ, "XLA_FLAGS": "", **env}, timeout=200)
        assert second.returncode == 1
        assert second.stderr.strip().splitlines()[-1].startswith(f"error: workdir {tmp_path / 'run'} is in use "
                                                                 f"by another run (pid {run.pid} ")
    finally:
        os.kill(run.pid, signal.SIGTERM)
        os.kill(run.pid, signal.SIGCONT)
    out = finish(run)
    assert run.returncode == 128 + signal.SIGTERM, out[-3000:]
    stopped = out.strip().splitlines()[-1]
    assert stopped.startswith("stopped by SIGTERM after step ") and "run the same command to continue" in stopped
    step = int(stopped.split("after step ")[1].split(":")[0])
    assert 5 <= step < 300 and (tmp_path / "run" / "checkpoints" / str(step)).is_dir()

    # The stopped run's lock is free (its process is gone): the rerun takes it and finishes.
    rerun = start(tmp_path / "run", settings, log_name="rerun", env=env)
    assert finish(rerun) and rerun.returncode == 0, open(rerun.log).read()[-3000:]
    assert f"resumed at step {step}" in open(rerun.log).read()
    assert finish(straight) and straight.returncode == 0, open(straight.log).read()[-3000:]
    same_run(tmp_path / "run", tmp_path / "straight")


def test_processes_stop_together_and_checkpoints_move_between_process_counts(tmp_path, tok_path):
    settings = TOY + ["train.steps=20", "train.log_every=2", "train.eval_every=10", "train.checkpoint_every=10",
                      "model.vocab_size=300", f"data.tokenizer={tok_path}"]
    env = {"ANDREA_CACHE": str(tmp_path / "cache")}
    port = portpicker.pick_unused_port()
    two = [start(tmp_path / "two", settings, "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                 "--process-id", str(i), log_name=f"p{i}", env=env) for i in range(2)]
    one = start(tmp_path / "one", settings, env=env)
    wait_for_a_line(two[1], "ANDREA:")  # printed once the signals are caught, before step 1 compiles
    os.kill(two[1].pid, signal.SIGTERM)  # only process 1 is told to stop
    outs = [finish(p) for p in two]
    assert [p.returncode for p in two] == [143, 143], outs[0][-2000:] + outs[1][-2000:]
    last = [o.strip().splitlines()[-1] for o in outs]
    assert last[0] == last[1] and last[0].startswith("stopped by SIGTERM after step ")  # the same step
    step = int(last[0].split("after step ")[1].split(":")[0])
    assert step == 2  # the processes agree at the first log step
    finish(one)
    assert one.returncode == 0, open(one.log).read()[-3000:]

    # 2 processes -> 1, and 1 process (from its step-10 checkpoint) -> 2.
    shutil.copytree(tmp_path / "one", tmp_path / "one_to_two", ignore=shutil.ignore_patterns("20"))
    port = portpicker.pick_unused_port()
    resumed = [start(tmp_path / "two", settings, log_name="resumed", env=env)] + [
        start(tmp_path / "one_to_two", settings, "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
              "--process-id", str(i), log_name=f"p{i}", env=env) for i in range(2)]
    outs = [finish(p) for p in resumed]
    assert [p.returncode for p in resumed] == [0, 0, 0], [o[-2000:] for o in outs]
    assert f"resumed at step {step}" in outs[0] and "resumed at step 10" in outs[1]
    same_run(tmp_path / "two", tmp_path / "one", exact=False)  # all-reduce sums in another order
    same_run(tmp_path / "one_to_two", tmp_path / "one", exact=False)


def test_fresh_caches_give_the_same_run_and_old_checkpoints_go(tmp_path):
    settings = TOY + ["train.steps=4", "train.log_every=1", "train.eval_every=2", "train.checkpoint_every=1",
                      "train.keep_checkpoints=2", "model.vocab_size=300"]  # the tokenizer is trained in each cache
    runs = [start(tmp_path / name, settings, env={"ANDREA_CACHE": str(tmp_path / f"cache_{name}")})
            for name in ("a", "b")]
    for p in runs:
        assert finish(p) and p.returncode == 0, open(p.log).read()[-3000:]
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()
    same_run(tmp_path / "a", tmp_path / "b")
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir()) == ["3", "4"]


def diverging(tok_path, *extra):
    # lr 0 at the first update (warmup from 0), then 1e30: the loss of step 3 is the first not finite.
    return config_lib.validate(config_lib.override(config_lib.load("tiny"), TOY + [
        "optim.lr=1e30", "optim.warmup_steps=1", "prores.schedule=none", "model.vocab_size=300",
        f"data.tokenizer={tok_path}", "train.eval_every=0", *extra]))


def test_non_finite_loss_is_reported_at_its_step_and_never_checkpointed(tmp_path, tok_path):
    cfg = diverging(tok_path, "train.steps=8", "train.log_every=10", "train.checkpoint_every=2")
    with pytest.raises(trainer.TrainingError, match=r"non-finite loss (nan|inf) at step 3;"):
        trainer.train(cfg, tmp_path, show_progress=False)  # seen at step 4, the next checkpoint
    losses = np.load(tmp_path / "step_losses.npy")
    assert np.all(np.isfinite(losses[:2])) and not np.isfinite(losses[2])
    assert inference.checkpoint_steps(tmp_path) == [2]
    params = inference.load(workdir=tmp_path).params
    assert all(np.all(np.isfinite(np.asarray(p))) for p in jax.tree.leaves(params))


def test_skip_nonfinite_counts_skipped_updates_and_goes_on_until_stuck(tmp_path, tok_path):
    cfg = diverging(tok_path, "train.steps=8", "train.log_every=1", "train.checkpoint_every=2",
                    "optim.skip_nonfinite=true", "optim.max_consecutive_skips=3")
    with pytest.raises(trainer.TrainingError, match=r"the last 3 updates \(steps 3-5\) had non-finite gradients"):
        trainer.train(cfg, tmp_path, show_progress=False)
    lines = metric_lines(tmp_path)
    assert [l["step"] for l in lines] == [1, 2, 3, 4]  # went on after the first non-finite loss
    assert [l["skipped_updates"] for l in lines] == [0, 0, 1, 2]
    assert inference.checkpoint_steps(tmp_path) == [2, 4]  # saved while skipping: parameters untouched
