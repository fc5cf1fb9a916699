"""andrea_jax/signals.py: a second SIGINT or SIGTERM stops the process within 5 s, whichever thread
receives it, whatever the main thread is blocked in and whatever handler the process inherited;
the first stops a command normally. Toy programs that block, and the real generate, evaluate and
prepare commands (train.py's slow checkpoint: tests/test_resume.py)."""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from _devices import cpu_devices_env
from _helpers import DEFAULT_SIGINT, IGNORING_SIGINT, ROOT, wait_for_text

NAMES = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}

# The main thread blocks in C (a lock held forever) and never runs a Python handler; the signals
# go to another thread, one per line on stdin.
BLOCKED_IN_A_LOCK = """
    import signal, sys, threading, time
    from andrea_jax import signals

    @signals.command
    def main():
        sleeper = threading.Thread(target=time.sleep, args=(3600,), daemon=True)
        sleeper.start()
        def kicker():
            for line in sys.stdin:
                signal.pthread_kill(sleeper.ident, int(line))
        threading.Thread(target=kicker, daemon=True).start()
        print("blocked", flush=True)
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()

    sys.exit(main())
"""

# Sleeps until a signal; `cleanup` is the body of its `finally`, indented as the template is.
SLEEPER = """
    import signal, sys, threading, time
    from andrea_jax import signals

    @signals.command
    def main():
        try:
            print("working", flush=True)
            time.sleep(600)
        finally:
{cleanup}

    print("SIGINT ignored:", signal.getsignal(signal.SIGINT) == signal.SIG_IGN, flush=True)
    sys.exit(main())
"""
# The first signal interrupts the sleep; the cleanup it starts then blocks in C forever.
STUCK_CLEANUP = SLEEPER.format(cleanup="""\
            print("cleaning up", flush=True)
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()""")
# The first signal stops it normally: the cleanup runs, then the one-line error.
SLEEPS = SLEEPER.format(cleanup='            print("cleanup ran", flush=True)')

# A forked child has the parent's pipe but not its watcher: a Ctrl-C to the process group must
# count once in the parent, not once per process.
FORKS = """
    import os, sys, time
    from andrea_jax import signals

    # one write per line: parent and child answer the same Ctrl-C into one log, and print's pieces
    # from the two could interleave ("firstfirst  1146511463")
    signals.FirstSignal(lambda signum, frame: os.write(1, f"first {os.getpid()}\\n".encode())).install()
    if os.fork() == 0:
        time.sleep(600)
        os._exit(0)
    print("forked", flush=True)
    while True:
        time.sleep(600)
"""


def start(tmp_path, program, prefix=(), **popen):
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(program))
    log = (tmp_path / "program.log").open("w")
    proc = subprocess.Popen([*prefix, sys.executable, str(path)], stdout=log, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, **popen)
    proc.log = log.name
    return proc


def start_command(tmp_path, argv):
    log = (tmp_path / "command.log").open("w")
    proc = subprocess.Popen([sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            stdin=subprocess.DEVNULL, env=cpu_devices_env(1))
    proc.log = log.name
    return proc


def output(proc) -> str:
    return open(proc.log).read()


def seconds_to_exit(proc, send, timeout=30) -> float:
    """Calls send() (the second signal) and returns the seconds until the process ended."""
    sent = time.monotonic()
    send()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"still running {timeout} s after the second signal:\n{output(proc)[-2000:]}")
    return time.monotonic() - sent


def still_running_after_the_first(proc, seconds=0.5):
    time.sleep(seconds)
    assert proc.poll() is None, output(proc)[-2000:]


def stopped_by(proc, signum, seconds):
    out = output(proc)
    assert proc.returncode == 128 + signum and seconds < 5, (proc.returncode, seconds, out[-2000:])
    assert out.strip().splitlines()[-1] == f"error: {NAMES[signum]}", out[-2000:]


@pytest.fixture
def reaped():
    """Processes appended to it are killed at the end of the test, if still running."""
    procs = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def closing():
    with contextlib.ExitStack() as stack:
        yield stack


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_to_another_thread_stops_a_main_thread_blocked_in_a_lock(tmp_path, reaped, signum):
    proc = start(tmp_path, BLOCKED_IN_A_LOCK, stdin=subprocess.PIPE)
    reaped.append(proc)
    wait_for_text(proc, "blocked")

    def kick():
        proc.stdin.write(f"{int(signum)}\n")
        proc.stdin.flush()

    kick()
    still_running_after_the_first(proc)  # the main thread never ran its handler
    stopped_by(proc, signum, seconds_to_exit(proc, kick))


@pytest.mark.parametrize("prefix", [DEFAULT_SIGINT, IGNORING_SIGINT], ids=["default", "sigint-ignored"])
def test_a_second_sigint_stops_a_program_whose_cleanup_is_stuck(tmp_path, reaped, prefix):
    proc = start(tmp_path, STUCK_CLEANUP, prefix=prefix)
    reaped.append(proc)
    wait_for_text(proc, "working")
    assert f"SIGINT ignored: {prefix is IGNORING_SIGINT}" in output(proc)  # as inherited, before main installed its own
    os.kill(proc.pid, signal.SIGINT)
    wait_for_text(proc, "cleaning up")
    still_running_after_the_first(proc)
    stopped_by(proc, signal.SIGINT, seconds_to_exit(proc, lambda: os.kill(proc.pid, signal.SIGINT)))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_first_signal_stops_a_command_normally(tmp_path, reaped, signum):
    proc = start(tmp_path, SLEEPS)
    reaped.append(proc)
    wait_for_text(proc, "working")
    stopped_by(proc, signum, seconds_to_exit(proc, lambda: os.kill(proc.pid, signum)))
    assert "cleanup ran" in output(proc)


def test_a_forked_child_does_not_count_in_the_parent(tmp_path, reaped):
    proc = start(tmp_path, FORKS, start_new_session=True)
    reaped.append(proc)
    try:
        wait_for_text(proc, "forked")
        os.killpg(proc.pid, signal.SIGINT)  # one Ctrl-C: one SIGINT to each process of the group
        wait_for_text(proc, f"first {proc.pid}")
        deadline = time.monotonic() + 30
        while output(proc).count("first") < 2:  # the child's too, answered by its own handler
            assert time.monotonic() < deadline, output(proc)
            time.sleep(0.01)
        still_running_after_the_first(proc, seconds=1)
        stopped_by(proc, signal.SIGINT, seconds_to_exit(proc, lambda: os.kill(proc.pid, signal.SIGINT)))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the child


def tgkill(pid: int, tid: int, signum: int) -> None:
    """signum to one thread of another process (signal.pthread_kill reaches only our own)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.tgkill(pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


def reading_a_fifo(tmp_path, command, reaped, closing):
    """The real command, its main thread blocked in C reading a FIFO that a writer holds open."""
    fifo = tmp_path / "input.fifo"
    os.mkfifo(fifo)
    flag = {"generate": "--prompt-file", "evaluate": "--task"}[command]
    proc = start_command(tmp_path, ["-m", f"andrea_jax.serve.{command}", "--workdir", str(tmp_path / "unread"),
                                    flag, str(fifo)])
    reaped.append(proc)
    deadline = time.monotonic() + 120
    while True:  # opens once the command opened its end: main() and its handlers are in place
        try:
            closing.callback(os.close, os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            break
        except OSError as e:
            assert e.errno == errno.ENXIO and time.monotonic() < deadline and proc.poll() is None, output(proc)
            time.sleep(0.01)
    # Between its open() and its read() the main thread runs bytecode, where it would answer a signal.
    quiet_since, last = time.monotonic(), None
    while time.monotonic() - quiet_since < 0.5:  # asleep in the kernel (S), not woken since
        assert time.monotonic() < deadline and proc.poll() is None, output(proc)
        now = main_thread_sleep(proc.pid)
        if now != last or now[0] != "S":
            quiet_since, last = time.monotonic(), now
        time.sleep(0.05)
    return proc


def main_thread_sleep(pid: int) -> tuple[str, str]:
    """(state, voluntary context switches) of the process's main thread."""
    status = open(f"/proc/{pid}/task/{pid}/status").read()
    state = re.search(r"^State:\s+(\S)", status, re.M)[1]
    return state, re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M)[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tgkill: Linux")
@pytest.mark.parametrize("command,signum", [("generate", signal.SIGINT), ("evaluate", signal.SIGTERM)])
def test_real_commands_blocked_reading_stop_on_a_second_signal_to_other_threads(tmp_path, reaped, closing,
                                                                              command, signum):
    proc = reading_a_fifo(tmp_path, command, reaped, closing)
    others = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
    assert others  # the watcher's thread at least
    tgkill(proc.pid, others[0], signum)
    still_running_after_the_first(proc)  # the main thread, still in read(), never ran its handler
    stopped_by(proc, signum, seconds_to_exit(proc, lambda: tgkill(proc.pid, others[-1], signum)))


def test_a_real_command_stops_normally_on_the_first_signal(tmp_path, reaped, closing):
    proc = reading_a_fifo(tmp_path, "generate", reaped, closing)
    stopped_by(proc, signal.SIGINT, seconds_to_exit(proc, lambda: os.kill(proc.pid, signal.SIGINT)))


# Each command's real main() with its heavy step (loading a model, running the pipeline) replaced
# by one whose cleanup is stuck.
STUCK_STEP = """
import sys, threading, time
import {module} as command, {owner} as owner
def stuck(*args, **kwargs):
    try:
        print("working", flush=True)
        time.sleep(600)
    finally:
        print("cleaning up", flush=True)
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()
owner.{step} = stuck
sys.exit(command.main({argv!r}))
"""
COMMANDS = {  # the command's module, the module and name of its heavy step, its arguments
    "generate": ("andrea_jax.serve.generate", "andrea_jax.serve.load", "load_from_args",
                 ["--workdir", "w", "--prompt", "hi"]),
    "evaluate": ("andrea_jax.serve.evaluate", "andrea_jax.serve.load", "load_from_args", ["--workdir", "w"]),
    "prepare": ("andrea_jax.data.prepare.driver", "andrea_jax.data.prepare.driver", "run_pipeline",
                ["--source", "files", "--path", "in", "--out", "out"]),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_commands_whose_first_signal_is_stuck_stop_on_the_second(tmp_path, reaped, command):
    module, owner, step, argv = COMMANDS[command]
    proc = start_command(tmp_path, ["-c", STUCK_STEP.format(module=module, owner=owner, step=step, argv=argv)])
    reaped.append(proc)
    wait_for_text(proc, "working")
    os.kill(proc.pid, signal.SIGTERM)
    wait_for_text(proc, "cleaning up")
    still_running_after_the_first(proc)
    stopped_by(proc, signal.SIGTERM, seconds_to_exit(proc, lambda: os.kill(proc.pid, signal.SIGTERM)))
