"""Stopping and resuming real train.py processes: SIGTERM (143) or SIGINT (130) checkpoints and
exits, a second signal stops at once, the rerun gives the losses of an uninterrupted run bit for bit
(mid-way through the ProRes ramp); a busy workdir is refused, a dead run's lock taken over; processes
of a multi-process run stop together, and checkpoints move between process counts. Also non-finite
losses and parameters: reported at their own step and never checkpointed, or skipped when asked,
also from a resume."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import portpicker
import pytest

from andrea_jax import config as config_lib, configs
from andrea_jax.errors import TrainingError
from andrea_jax.serve import load
from andrea_jax.train import loop as trainer, preemption
from andrea_jax.workdir import Workdir
from _devices import cpu_devices_env
from _helpers import IGNORING_SIGINT, PROGRAMS, ROOT, train_command, wait_for_text
from test_multihost import metric_lines

TOY = ["train.eval_batches=1", "train.batch_size=4", "train.sample_tokens=0", "model.n_layer=2",
       "model.d_model=32", "model.seq_len=16", "diagnostics.tensorboard=false"]
L = 2  # TOY's model.n_layer


def prores(T):
    """Linear ProRes with warmup T: block l is fully on after T * l steps, so a run stopped or
    resumed before step T * L does so mid-ramp, and its alphas must come back with its step. The
    blocks' updates are scaled by alpha too (prores.scale_updates), which a resume must also keep."""
    return ["prores.schedule=linear", f"prores.warmup={T}", "prores.scale_updates=alpha"]


SPIKY = ["optim.skip_spikes=1", "optim.skip_spikes_window=8"]


def start(workdir, settings, *flags, log_name="log", env=None):
    """A train.py process writing its stdout and stderr to files (a full pipe would block it)."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = (workdir.parent / f"{workdir.name}.{log_name}").open("w")
    env = {**cpu_devices_env(1), **(env or {})}
    proc = subprocess.Popen(train_command(workdir, settings, *flags), stdout=out, stderr=subprocess.STDOUT, text=True,
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
    keys = ("step", "loss", "lr", "grad_norm", "val_loss", "spike_score", "skipped_spikes")
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
    T = 150  # T * L = 300 = train.steps: wherever the signal lands, the rerun resumes mid-ramp
    # Loss-spike skipping at a band so narrow that it skips often: which updates it skips depends on
    # the window of losses, which the rerun must restore with the checkpoint.
    settings = TOY + prores(T) + ["train.steps=300", "train.log_every=5", "train.eval_every=100",
                                  "train.checkpoint_every=100", "model.vocab_size=300", f"data.tokenizer={tok_path}",
                                  *SPIKY]
    straight = start(tmp_path / "straight", settings)
    run = start(tmp_path / "run", settings)
    wait_for_a_metric_line(tmp_path / "run", [run])
    os.kill(run.pid, signal.SIGSTOP)  # hold it mid-run, lock held
    try:
        second = subprocess.run(train_command(tmp_path / "run", settings), capture_output=True, text=True, cwd=ROOT,
                                env=cpu_devices_env(1), timeout=200)
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
    assert 5 <= step < T * L and (tmp_path / "run" / "checkpoints" / str(step)).is_dir()

    # The stopped run's lock is free (its process is gone): the rerun takes it and finishes.
    rerun = start(tmp_path / "run", settings, log_name="rerun")
    assert finish(rerun) and rerun.returncode == 0, open(rerun.log).read()[-3000:]
    assert f"resumed at step {step}" in open(rerun.log).read()
    assert finish(straight) and straight.returncode == 0, open(straight.log).read()[-3000:]
    same_run(tmp_path / "run", tmp_path / "straight")
    skipped = [l["skipped_spikes"] for l in metric_lines(tmp_path / "straight")]
    assert skipped[-1] > 0 and any(0 < s < skipped[-1] for s in skipped), skipped  # skips before and after a restart


def test_a_resumed_run_reports_only_the_spikes_skipped_after_its_checkpoint(tmp_path, tok_path):
    settings = TOY + prores(150) + ["train.steps=120", "train.log_every=5", "train.eval_every=60",
                                    "train.checkpoint_every=60", "model.vocab_size=300",
                                    f"data.tokenizer={tok_path}", *SPIKY]
    first = start(tmp_path / "run", settings)
    assert finish(first) and first.returncode == 0, open(first.log).read()[-3000:]
    skipped = {line["step"]: line["skipped_spikes"] for line in metric_lines(tmp_path / "run")}
    assert 0 < skipped[60] < skipped[120], skipped
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "120")

    rerun = start(tmp_path / "run", settings, log_name="rerun")
    out = finish(rerun)
    assert rerun.returncode == 0 and "resumed at step 60" in out, out[-3000:]
    reported = [int(n) for n in re.findall(r"warning: (\d+) loss spike\(s\) skipped", out)]
    assert sum(reported) == skipped[120] - skipped[60], (reported, skipped)


def test_processes_stop_together_and_checkpoints_move_between_process_counts(tmp_path, tok_path):
    # T = 10: the resumes at steps 2 and 10 see alphas [0.2, 0.1] and [1, 0.5]; layer 2 ramps to step 20.
    settings = TOY + prores(10) + ["train.steps=20", "train.log_every=2", "train.eval_every=10",
                                   "train.checkpoint_every=10", "model.vocab_size=300", f"data.tokenizer={tok_path}"]
    port = portpicker.pick_unused_port()
    two = [start(tmp_path / "two", settings, "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                 "--process-id", str(i), log_name=f"p{i}") for i in range(2)]
    one = start(tmp_path / "one", settings)
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
    resumed = [start(tmp_path / "two", settings, log_name="resumed")] + [
        start(tmp_path / "one_to_two", settings, "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
              "--process-id", str(i), log_name=f"p{i}") for i in range(2)]
    outs = [finish(p) for p in resumed]
    assert [p.returncode for p in resumed] == [0, 0, 0], [o[-2000:] for o in outs]
    assert f"resumed at step {step}" in outs[0] and "resumed at step 10" in outs[1]
    same_run(tmp_path / "two", tmp_path / "one", exact=False)  # all-reduce sums in another order
    same_run(tmp_path / "one_to_two", tmp_path / "one", exact=False)


def test_fresh_caches_give_the_same_run_and_old_checkpoints_go(tmp_path):
    settings = TOY + prores(2) + ["train.steps=4", "train.log_every=1", "train.eval_every=2",
                                  "train.checkpoint_every=1", "train.keep_checkpoints=2",
                                  "model.vocab_size=300"]  # the tokenizer is trained in each cache
    runs = [start(tmp_path / name, settings, env={"ANDREA_CACHE": str(tmp_path / f"cache_{name}")})
            for name in ("a", "b")]
    for p in runs:
        assert finish(p) and p.returncode == 0, open(p.log).read()[-3000:]
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()
    same_run(tmp_path / "a", tmp_path / "b")
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir()) == ["3", "4"]


def diverging(tok_path, *extra):
    # lr 0 at the first update (warmup from 0), then 1e30: the loss of step 3 is the first not finite.
    return config_lib.validate(config_lib.override(configs.load("tiny"), TOY + [
        "optim.lr=1e30", "optim.warmup_steps=1", "prores.schedule=none", "model.vocab_size=300",
        f"data.tokenizer={tok_path}", "train.eval_every=0", *extra]))


def test_non_finite_loss_is_reported_never_checkpointed_and_skipping_may_be_switched_on_to_resume(
        tmp_path, tok_path):
    cfg = diverging(tok_path, "train.steps=8", "train.log_every=10", "train.checkpoint_every=2")
    with pytest.raises(TrainingError, match=r"non-finite loss (nan|inf) at step 3;"):
        trainer.train(cfg, tmp_path, show_progress=False)  # seen at step 4, the next checkpoint
    losses = np.load(tmp_path / "step_losses.npy")
    assert np.all(np.isfinite(losses[:2])) and not np.isfinite(losses[2])
    assert Workdir(tmp_path).checkpoint_steps() == [2]
    params = load.load(workdir=tmp_path).params
    assert all(np.all(np.isfinite(np.asarray(p))) for p in jax.tree.leaves(params))

    # docs/TRAINING.md's way past a NaN: the same run with optim.skip_nonfinite=true is accepted without
    # --allow-schedule-change, resumes at step 2 and skips every non-finite update from there (this
    # diverged run never recovers: steps 3-8 are all skipped, 6 in a row, under the limit of 10).
    skipping = diverging(tok_path, "train.steps=8", "train.log_every=1", "train.checkpoint_every=2",
                         "optim.skip_nonfinite=true")
    lines = trainer.train(skipping, tmp_path, show_progress=False)
    assert [l["step"] for l in lines] == [3, 4, 5, 6, 7, 8]
    assert [l["skipped_updates"] for l in lines] == [1, 2, 3, 4, 5, 6]
    assert Workdir(tmp_path).checkpoint_steps()[-1] == 8
    after = load.load(workdir=tmp_path).params  # no update was applied after step 2
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_parameters_that_are_not_finite_are_never_checkpointed(tmp_path, tok_path):
    # optim.lr=1e39 is finite for the config but inf in float32: the first update turns the
    # parameters non-finite while the loss of step 1 (computed before it) is finite, so only the
    # parameter check before the step-1 checkpoint can stop the run there.
    cfg = diverging(tok_path, "optim.lr=1e39", "optim.warmup_steps=0", "train.steps=3", "train.log_every=10",
                    "train.checkpoint_every=1")
    with pytest.raises(TrainingError, match=r"^the parameters after step 1 are not finite;"):
        trainer.train(cfg, tmp_path, show_progress=False)
    losses = np.load(tmp_path / "step_losses.npy")
    assert len(losses) == 1 and np.isfinite(losses[0])  # the loss check had nothing to report
    assert Workdir(tmp_path).checkpoint_steps() == []


def slow_save_command(workdir, settings):
    """train.py's command line, with a checkpoint save that takes 10 minutes."""
    return [sys.executable, str(PROGRAMS / "slow_save_train.py")] + train_command(workdir, settings)[2:]


def test_sigint_checkpoints_and_exits_130(tmp_path, tok_path):
    settings = TOY + prores(150) + ["train.steps=300", "train.log_every=5", "train.eval_every=100",
                                    "train.checkpoint_every=100", "model.vocab_size=300", f"data.tokenizer={tok_path}"]
    run = start(tmp_path / "run", settings)
    wait_for_a_metric_line(tmp_path / "run", [run])
    os.kill(run.pid, signal.SIGINT)
    out = finish(run)
    assert run.returncode == 130, out[-3000:]
    assert "SIGINT: stopping after this step, with a checkpoint (send it again to stop at once)" in out
    stopped = out.strip().splitlines()[-1]
    step = int(stopped.split("after step ")[1].split(":")[0])
    checkpoint = tmp_path / "run" / "checkpoints" / str(step)
    assert stopped == (f"stopped by SIGINT after step {step}: checkpoint {checkpoint} saved; "
                       f"run the same command to continue")
    # not a checkpoint step: the one checkpoint is the signal's
    assert 5 <= step < 100 and Workdir(tmp_path / "run").checkpoint_steps() == [step]
    assert len(np.load(tmp_path / "run" / "step_losses.npy")) == step


def second_signal_run(tmp_path, tok_path, signum, prefix=()):
    """The slow-save run: `signum` once a metric line is written (the step finishes, then the save
    starts, for 10 minutes), `signum` again once the save started. (log, exit code, seconds from
    the second signal to the exit)."""
    settings = TOY + prores(150) + ["train.steps=300", "train.log_every=5", "train.eval_every=100",
                                    "train.checkpoint_every=100", "model.vocab_size=300", f"data.tokenizer={tok_path}"]
    workdir = tmp_path / "run"
    workdir.mkdir()
    log = (tmp_path / "run.log").open("w")
    proc = subprocess.Popen([*prefix, *slow_save_command(workdir, settings)], stdout=log, stderr=subprocess.STDOUT,
                            text=True, cwd=ROOT, env=cpu_devices_env(1))
    proc.log = log.name
    try:
        wait_for_a_metric_line(workdir, [proc])
        os.kill(proc.pid, signum)  # the first: finish the step, then save (for 10 minutes)
        wait_for_text(proc, "slow save started", timeout=200)
        sent = time.monotonic()
        os.kill(proc.pid, signum)  # the second: stop now
        out = finish(proc, timeout=120)  # long before the save would end
        seconds = time.monotonic() - sent
    finally:
        if proc.poll() is None:  # a second signal that did not stop it
            proc.kill()
            proc.wait()
    assert Workdir(workdir).checkpoint_steps() == [], out[-3000:]
    return out, proc.returncode, seconds


@pytest.mark.parametrize("signum, code, last_line", [(signal.SIGINT, 130, "error: interrupted"),
                                                     (signal.SIGTERM, 143, "error: terminated")])
def test_a_second_signal_stops_at_once_without_the_checkpoint(tmp_path, tok_path, signum, code, last_line):
    out, returncode, seconds = second_signal_run(tmp_path, tok_path, signum)
    name = signal.Signals(signum).name
    assert returncode == code and seconds < 5, (seconds, out[-3000:])
    assert f"{name}: stopping after this step, with a checkpoint (send it again to stop at once)" in out
    assert out.strip().splitlines()[-1] == last_line
    assert f"stopped by {name}" not in out


def test_a_run_started_with_sigint_ignored_still_stops_on_the_second_sigint(tmp_path, tok_path):
    out, code, seconds = second_signal_run(tmp_path, tok_path, signal.SIGINT, prefix=IGNORING_SIGINT)
    assert code == 130 and seconds < 5, (seconds, out[-3000:])
    assert "SIGINT: stopping after this step" in out and out.strip().splitlines()[-1] == "error: interrupted"


def test_the_first_signal_is_recorded_and_uninstall_restores_the_handlers_before():
    """In-process, the first signal only (a second one ends the process: test_signals.py)."""
    calls = []
    before = lambda signum, frame: calls.append(signum)
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, before),
                signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
    wakeup_before = signal.set_wakeup_fd(-1)
    try:
        stop = preemption.StopRequests().install()
        watcher_fd = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(watcher_fd)
        assert watcher_fd != -1  # the watcher's pipe, while installed
        signal.raise_signal(signal.SIGTERM)
        assert stop.signum == signal.SIGTERM and calls == []  # the first is only recorded
        assert stop.agreed(at_sync_point=False) == signal.SIGTERM  # one process: stop after this step
        stop.uninstall()
        assert signal.getsignal(signal.SIGTERM) is before and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.set_wakeup_fd(-1) == -1  # as it was found
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        signal.set_wakeup_fd(wakeup_before)


def test_skip_nonfinite_counts_skipped_updates_and_goes_on_until_stuck(tmp_path, tok_path):
    cfg = diverging(tok_path, "train.steps=8", "train.log_every=1", "train.checkpoint_every=2",
                    "optim.skip_nonfinite=true", "optim.max_consecutive_skips=3")
    with pytest.raises(TrainingError, match=r"the last 3 updates \(steps 3-5\) had non-finite gradients"):
        trainer.train(cfg, tmp_path, show_progress=False)
    lines = metric_lines(tmp_path)
    assert [l["step"] for l in lines] == [1, 2, 3, 4]  # went on after the first non-finite loss
    assert [l["skipped_updates"] for l in lines] == [0, 0, 1, 2]
    assert Workdir(tmp_path).checkpoint_steps() == [2, 4]  # saved while skipping: parameters untouched


def test_a_kill_while_a_checkpoint_commits_leaves_the_previous_one_and_the_rerun_continues_exactly(tmp_path,
                                                                                                    tok_path):
    # The step-6 checkpoint's files are written but its commit (orbax's rename of the temporary
    # folder, in its background thread) waits: SIGKILL then, mid-save, while training goes on.
    settings = TOY + prores(5) + ["train.steps=9", "train.log_every=1", "train.eval_every=3",
                                  "train.checkpoint_every=3", "model.vocab_size=300", f"data.tokenizer={tok_path}"]
    straight = start(tmp_path / "straight", settings)
    workdir = tmp_path / "run"
    workdir.mkdir()
    log = (tmp_path / "run.log").open("w")
    program = [sys.executable, str(PROGRAMS / "slow_commit_train.py")] + train_command(workdir, settings)[2:]
    run = subprocess.Popen(program, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                           env={**cpu_devices_env(1), "ANDREA_SLOW_COMMIT_FROM": "6"})
    run.log = log.name
    try:
        wait_for_text(run, "slow commit of checkpoint 6 started", timeout=200)
        os.kill(run.pid, signal.SIGKILL)
        finish(run, timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == -signal.SIGKILL
    left = sorted(p.name for p in (workdir / "checkpoints").iterdir())
    assert Workdir(workdir).checkpoint_steps() == [3] and any(".orbax-checkpoint-tmp" in n for n in left), left

    rerun = start(workdir, settings, log_name="rerun")
    out = finish(rerun)
    assert rerun.returncode == 0, out[-3000:]
    assert "resumed at step 3" in out
    assert finish(straight) and straight.returncode == 0, open(straight.log).read()[-3000:]
    same_run(workdir, tmp_path / "straight")
