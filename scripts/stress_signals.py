"""The second-signal scenario of tests/test_resume.py, N times: does a second signal stop train.py
within 5 s every time?

    python scripts/stress_signals.py [--runs 20] [--signal INT|TERM] [--sigint-ignored] [--keep DIR]

Each run starts a toy train.py whose checkpoint save is patched to take 10 minutes, sends the
signal once the first metric line is written (the step finishes, then the save starts), and again
once the save started; it reports the seconds from the second signal to the exit and the exit code
(128 + N expected). --sigint-ignored starts each run with SIGINT ignored, as `cmd &` in a script
does. Ends with `K/N stopped within 5 s`; exit status 0 only when K == N.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIMIT_S = 5.0
SETTINGS = ["train.eval_batches=1", "train.batch_size=4", "train.sample_tokens=0", "model.n_layer=2",
            "model.d_model=32", "model.seq_len=16", "diagnostics.tensorboard=false", "prores.schedule=linear",
            "prores.warmup=150", "prores.scale_updates=alpha", "train.steps=300", "train.log_every=5",
            "train.eval_every=100", "train.checkpoint_every=100", "model.vocab_size=300"]
PROGRAMS = ROOT / "tests" / "programs"
SLOW_SAVE = PROGRAMS / "slow_save_train.py"  # a checkpoint save that takes 10 minutes
IGNORING_SIGINT = [sys.executable, str(PROGRAMS / "with_sigint.py"), "ignore"]
DEFAULT_SIGINT = [sys.executable, str(PROGRAMS / "with_sigint.py"), "default"]


def tokenizer(folder: pathlib.Path) -> pathlib.Path:
    """The tests' small tokenizer (300 tokens on the embedded corpus), trained once."""
    path = folder / "tokenizer.json"
    code = ("import sys\n"
            "from andrea_jax.data import pipeline, tokenizer as tok\n"
            "tok.train([pipeline.read_text(pipeline.EMBEDDED_CORPUS)[:100_000]], 300).save(sys.argv[1])\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"training the tokenizer failed:\n{proc.stderr[-2000:]}")
    return path


def wait_for(proc, log: pathlib.Path, done, what: str, timeout=300) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"no {what} (exit {proc.poll()}):\n{log.read_text()[-2000:]}")
        time.sleep(0.01)


def one_run(folder: pathlib.Path, tok: pathlib.Path, signum: int, prefix) -> tuple[int | None, float, str]:
    """(exit code or None if still running after 60 s, seconds from the second signal, last line)."""
    workdir, log_path = folder / "run", folder / "run.log"
    workdir.mkdir(parents=True)
    cmd = [*prefix, sys.executable, str(SLOW_SAVE), "--config", "tiny", "--workdir", str(workdir)]
    for s in SETTINGS + [f"data.tokenizer={tok}"]:
        cmd += ["--set", s]
    env = {**os.environ, "XLA_FLAGS": "", "ANDREA_CACHE": str(folder / "cache"), "JAX_PLATFORMS": "cpu"}
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    metrics = workdir / "metrics.jsonl"
    try:
        wait_for(proc, log_path, lambda: metrics.exists() and metrics.read_text().strip(), "metric line")
        os.kill(proc.pid, signum)
        wait_for(proc, log_path, lambda: "slow save started" in log_path.read_text(), "slow save")
        sent = time.monotonic()
        os.kill(proc.pid, signum)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = None
        seconds = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = log_path.read_text().strip().splitlines()
    return code, seconds, lines[-1] if lines else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--signal", choices=("INT", "TERM"), default="INT")
    parser.add_argument("--sigint-ignored", action="store_true", help="start each run with SIGINT ignored")
    parser.add_argument("--keep", help="a folder for the runs (default: a temporary one, deleted)")
    args = parser.parse_args()
    signum = signal.Signals[f"SIG{args.signal}"]
    # The tests' persistent XLA cache: every run compiles the same programs.
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(),
                                                                    f"andrea_jax_tests_xla_{os.getuid()}"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    with tempfile.TemporaryDirectory() as tmp:
        base = pathlib.Path(args.keep or tmp)
        base.mkdir(parents=True, exist_ok=True)
        tok = tokenizer(base)
        ok = 0
        for i in range(1, args.runs + 1):
            code, seconds, last = one_run(base / f"run{i}", tok, signum,
                                          IGNORING_SIGINT if args.sigint_ignored else DEFAULT_SIGINT)
            good = code == 128 + signum and seconds < LIMIT_S
            ok += good
            print(f"run {i:2d}: {'ok  ' if good else 'FAIL'} exit {code} {seconds:6.3f} s after the second "
                  f"SIG{args.signal}; last line: {last!r}", flush=True)
    print(f"{ok}/{args.runs} stopped within {LIMIT_S:g} s")
    return 0 if ok == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
