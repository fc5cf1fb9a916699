"""SIGINT and SIGTERM for the long-running commands: the first one is the command's to answer, a
second one stops the process at once (exit 128 + N, one line on stderr).

The first signal goes to a Python handler, which CPython runs in the main thread between bytecodes:
the training loop records it and stops after the step with a checkpoint (train/preemption.py); the
other commands raise `Interrupted`, a KeyboardInterrupt, and `command` turns it into "error:
interrupted" and exit 128 + N. A Python handler alone cannot promise that a second signal stops the
process: a process-directed signal may be delivered to any thread (XLA's, orbax's, a data worker's),
and a main thread blocked in a C call (a lock, a device wait, a checkpoint wait) never runs it.

So every signal is also counted by a watcher thread. CPython's C-level handler, which runs in
whatever thread the kernel picked, writes the signal's number to the `signal.set_wakeup_fd` pipe; a
daemon thread reads it and on the second SIGINT / SIGTERM flushes what it can and calls `os._exit`.
The wakeup fd only fires for signals that have a Python-level handler, so the handlers are installed
whatever the process inherited, SIG_IGN included (a run started with SIGINT ignored still stops).
The alternative, blocking the signals in every thread but the main one (pthread_sigmask), misses
threads that C++ libraries (XLA's) started before the mask was set: they keep their own masks.

What can still hold the process is a C call that keeps the GIL while it blocks (the watcher then
cannot run); the standard library's blocking calls and JAX's device waits release it. Once the
interpreter is finalizing, CPython has put SIG_DFL back, so a signal then ends the process itself
(the shell still sees 128 + N). Pure stdlib, no jax import.
"""
from __future__ import annotations

import functools
import os
import signal
import sys
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_WORDS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}
_FLUSH_SECONDS = 1.0  # for the last line; stdout or stderr may be a pipe nobody reads


def describe(signum: int) -> str:
    """The one-line error of a command stopped by `signum`."""
    return f"error: {_WORDS.get(signum, signal.Signals(signum).name)}"


class Interrupted(KeyboardInterrupt):
    """The first SIGINT or SIGTERM, raised in the main thread (by `raise_interrupted`)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's code for a process ended by this signal


def raise_interrupted(signum, frame):
    raise Interrupted(signum)


class _Watch:
    """The process's watcher: one pipe and one daemon thread, started at the first arming. Armed
    while `depth` > 0; `count` counts SIGINT / SIGTERM since the outermost arming."""

    def __init__(self):
        self.lock = threading.Lock()
        self.depth = self.count = 0
        self.acted = False  # a handler has answered the first signal
        self.read_fd = self.write_fd = -1
        self.previous_fd = -1
        self.thread = None

    def arm(self) -> None:
        with self.lock:
            if self.thread is None:
                self.read_fd, self.write_fd = os.pipe()
                os.set_blocking(self.write_fd, False)  # set_wakeup_fd requires it
                self.thread = threading.Thread(target=self._run, name="andrea-signals", daemon=True)
                self.thread.start()
            if self.depth == 0:
                self.count, self.acted = 0, False
                self.previous_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
            self.depth += 1

    def disarm(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                current = signal.set_wakeup_fd(self.previous_fd)
                if current != self.write_fd:  # someone set their own since: theirs stays
                    signal.set_wakeup_fd(current)

    def _run(self) -> None:
        while data := os.read(self.read_fd, 64):
            for signum in data:
                if signum in SIGNALS and self.depth > 0:
                    self.count += 1
                    if self.count >= 2:
                        _stop_now(signum)


_watch = _Watch()
_fork_hooks_registered = False
_forking = threading.local()


# A forked child (multiprocessing) has the pipe but not the thread: its signals would be counted by
# the parent's watcher, so one Ctrl-C to the process group would count twice. The child resets its
# wakeup fd; until it has, the forking thread (the child's only one) blocks the signals, which stay
# pending rather than reach the parent's pipe.
def _before_fork() -> None:
    _forking.mask = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS) if _watch.depth > 0 else None


def _after_fork_in_parent() -> None:
    if getattr(_forking, "mask", None) is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, _forking.mask)
        _forking.mask = None


def _after_fork_in_child() -> None:
    global _watch
    old, _watch = _watch, _Watch()
    if old.depth > 0:  # CPython makes the forking thread the child's main one, where this is allowed
        signal.set_wakeup_fd(old.previous_fd)
    for fd in (old.read_fd, old.write_fd):
        if fd >= 0:
            os.close(fd)
    _after_fork_in_parent()  # the signals that came meanwhile are delivered now


def _stop_now(signum: int) -> None:
    def last_words():
        try:
            sys.stdout.flush()
            sys.stderr.write(f"\n{describe(signum)}\n")  # after a progress bar's unfinished line
            sys.stderr.flush()
        except Exception:  # a closed stream: the exit code still tells
            pass

    try:  # in a thread of its own: a main thread blocked writing to a full pipe holds the stream's lock
        speaker = threading.Thread(target=last_words, daemon=True)
        speaker.start()
        speaker.join(_FLUSH_SECONDS)
    finally:
        os._exit(128 + signum)


def signalled() -> bool:
    """Whether a SIGINT or SIGTERM came since the outermost `FirstSignal` was installed."""
    return _watch.acted or _watch.count > 0


class FirstSignal:
    """While installed (a context, or install / uninstall): the first SIGINT or SIGTERM calls
    `action(signum, frame)` in the main thread, a second one stops the process at once. Nests: the
    signals are counted from the outermost install. Only in the main thread (Python's rule for
    handlers); elsewhere nothing is installed. uninstall restores the handlers and wakeup fd that
    were there before."""

    def __init__(self, action):
        self.action = action
        self._previous = {}
        self._watch = None

    def install(self) -> "FirstSignal":
        global _fork_hooks_registered
        if threading.current_thread() is not threading.main_thread() or self._watch is not None:
            return self
        if not _fork_hooks_registered:
            os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                                after_in_child=_after_fork_in_child)
            _fork_hooks_registered = True
        self._watch = _watch
        self._watch.arm()
        self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def uninstall(self) -> None:
        for s, handler in self._previous.items():
            # None: a handler installed from C, which Python cannot put back
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        self._previous = {}
        if self._watch is _watch:  # not when this process is a fork of the one that installed it
            self._watch.disarm()
        self._watch = None

    def __enter__(self):
        return self.install()

    def __exit__(self, *exc):
        self.uninstall()

    def _handle(self, signum, frame):
        if _watch.acted:  # a later signal, or several at once: the watcher stops the process
            return
        _watch.acted = True
        self.action(signum, frame)


def command(main):
    """For a command's main function: while it runs, the first SIGINT or SIGTERM raises Interrupted
    in the main thread (main's cleanup runs, then one line "error: interrupted" or "error:
    terminated" and exit 128 + N) and a second one stops the process at once. After a signal the
    handlers stay installed: the process is on its way out, and its exit (threads joined, atexit
    work) must not be able to hold it."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        scope = FirstSignal(raise_interrupted).install()
        try:
            return main(*args, **kwargs)
        except KeyboardInterrupt as e:
            print(describe(getattr(e, "signum", signal.SIGINT)), file=sys.stderr, flush=True)
            return 128 + getattr(e, "signum", signal.SIGINT)
        finally:
            if not signalled():
                scope.uninstall()

    return wrapped
