"""Each optional extra of pyproject.toml, installed on its own in a fresh venv, runs its command.

    python scripts/check_extras.py [EXTRA ...]     (default: all of EXTRAS)

For each extra: a venv in a temporary folder under /tmp, `pip install -e "CHECKOUT[EXTRA]"` (with
torch pinned to its CPU build, so that lm-eval does not pull a CUDA torch of several GB), the
matching command's --help, and one import of what the extra is for. One line per extra:
`EXTRA: ok (install Ns, help Ns)`, or the step that failed with the last lines of its output; the
exit status is 1 when any failed. The venvs share pip's cache and are deleted afterwards.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONSTRAINTS = "torch==2.13.0\n"   # the CPU build; a newer torch is CUDA's
TAIL_LINES = 15

# extra: (the command whose --help must run, a Python check that the extra does its job)
EXTRAS = {
    "dask": (["andrea-prepare", "--help"],
             "import andrea_jax.data.prepare.pipelines, andrea_jax.data.prepare.dask_cluster, distributed, "
             "apache_beam.runners.dask.dask_runner"),
    "beam": (["andrea-prepare", "--help"], "import andrea_jax.data.prepare.pipelines"),
    "eval": (["andrea-lm-eval", "--help"],
             "from andrea_jax.serve import lm_eval_adapter as a; from lm_eval.api.registry import get_model; "
             "assert a.HAVE_LM_EVAL and get_model('andrea') is a.AndreaLM"),
    "wandb": (["andrea-train", "--help"], "from andrea_jax.train.metrics import import_wandb; import_wandb()"),
    "gcs": (["andrea-train", "--help"],
            "import fsspec; from andrea_jax.data import storage; storage.path('gs://bucket/x', 'data.path'); "
            "fsspec.get_filesystem_class('gs')"),
    "gpu-compile": (["andrea-aot", "--help"], "-m andrea_jax.aot --help"),
}


class StepFailed(Exception):
    def __init__(self, step: str, seconds: float, output: str):
        super().__init__(step)
        self.step, self.seconds, self.output = step, seconds, output


def run(step: str, cmd: list[str], cwd: pathlib.Path, env: dict) -> float:
    """Runs `cmd`; its seconds, or StepFailed with its output."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise StepFailed(f"{step} (exit {proc.returncode})", seconds, proc.stdout)
    return seconds


def check(extra: str, folder: pathlib.Path) -> str:
    help_cmd, python_check = EXTRAS[extra]
    venv = folder / "venv"
    bin_dir = venv / "bin"
    constraints = folder / "constraints.txt"
    constraints.write_text(CONSTRAINTS)
    # The commands run outside the checkout, so that only the install, not the repository on
    # sys.path, can provide what they import; the venv's bin first, as when it is activated.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["JAX_PLATFORMS"] = env.get("JAX_PLATFORMS", "cpu")
    try:
        run("venv", [sys.executable, "-m", "venv", str(venv)], folder, env)
        install = run("install", [str(bin_dir / "pip"), "install", "-q", "-c", str(constraints),
                                  "-e", f"{ROOT}[{extra}]"], folder, env)
        helps = run(" ".join(help_cmd), [str(bin_dir / help_cmd[0]), *help_cmd[1:]], folder, env)
        check_cmd = python_check.split() if python_check.startswith("-m ") else ["-c", python_check]
        run("check: python " + " ".join(check_cmd), [str(bin_dir / "python"), *check_cmd], folder, env)
    except StepFailed as failed:
        tail = "\n".join("    " + line for line in failed.output.rstrip().splitlines()[-TAIL_LINES:])
        return f"{extra}: FAILED at {failed.step} after {failed.seconds:.0f}s\n{tail}"
    return f"{extra}: ok (install {install:.0f}s, help {helps:.0f}s)"


def main(argv: list[str]) -> int:
    extras = argv or list(EXTRAS)
    unknown = [e for e in extras if e not in EXTRAS]
    if unknown:
        print(f"error: unknown extra {', '.join(unknown)}; known: {', '.join(EXTRAS)}", file=sys.stderr)
        return 2
    failed = 0
    for extra in extras:
        folder = pathlib.Path(tempfile.mkdtemp(prefix=f"andrea-extra-{extra}-", dir="/tmp"))
        try:
            line = check(extra, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        failed += "FAILED" in line.split("\n", 1)[0]
        print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
