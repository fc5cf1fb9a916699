"""What a newcomer's plain `pip install -e .` gets: the main job and every command's --help work
in a Python that refuses every optional dependency (the CUDA plugin, jax-triton, torch,
transformers, lm-eval, Beam, Dask, W&B, gcsfs), and nothing at the repository root shadows a
package that libraries probe for."""
import json
import os
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest

from _devices import cpu_devices_env
from _refuse import OPTIONAL, refusing_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_the_readme_starts_with_the_two_commands_that_ci_runs():
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    first, second = block.strip().splitlines()
    assert "pip install -e . &&" in first and "python train.py --config tiny" in first  # no extras
    assert 'pip install -e ".[test]"' in second and "pytest" in second
    ci = subprocess.run(["bash", str(ROOT / ".ci" / "run")], env={"CI_PRINT_ONLY": "1", "PATH": "/usr/bin:/bin"},
                        capture_output=True, text=True, timeout=60, check=True)
    assert ci.stdout.splitlines() == [first, second]  # CI runs exactly these, in this order


def test_the_refusing_python_refuses(tmp_path):
    probe = "import importlib.util, sys; print(all(importlib.util.find_spec(n) is None for n in sys.argv[1:]))"
    out = subprocess.run([sys.executable, "-c", probe, *OPTIONAL], env=refusing_env(tmp_path / "site"),
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


def test_the_main_job_runs_without_any_optional_dependency(tmp_path):
    workdir = tmp_path / "run"
    settings = ["train.steps=3", "train.log_every=1", "train.eval_every=3", "train.eval_batches=1",
                "train.checkpoint_every=3", "train.sample_tokens=8", "train.batch_size=4",
                "model.seq_len=32", "prores.schedule=linear", "prores.warmup=2"]
    proc = subprocess.run([sys.executable, "train.py", "--config", "tiny", "--workdir", str(workdir),
                           *[a for s in settings for a in ("--set", s)]],
                          cwd=ROOT, env=refusing_env(tmp_path / "site", env={**_env(tmp_path)}),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines if "loss" in l][:3] == [1, 2, 3]
    assert "Could not find cuda drivers" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_console_script_answers_help_without_any_optional_dependency(tmp_path, script):
    module, function = SCRIPTS[script].split(":")
    call = f"import sys; sys.argv = [{script!r}, '--help']; import {module}; sys.exit({module}.{function}())"
    env = refusing_env(tmp_path / "site", env=_env(tmp_path))
    proc = subprocess.run([sys.executable, "-c", call], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "usage" in proc.stdout.lower() and "Traceback" not in proc.stderr, proc.stdout + proc.stderr


def _env(tmp_path):
    return {**cpu_devices_env(1), "ANDREA_CACHE": str(tmp_path / "cache")}


def _site_packages_without(tmp_path, hidden: str) -> pathlib.Path:
    """A copy, by links, of this venv's site-packages without the package `hidden` and its metadata:
    the site-packages of a machine that never installed it (transformers 5.25 requires Hugging Face's
    `kernels`; an older transformers, or a venv that removed it, has none)."""
    import site
    installed = pathlib.Path(next(p for p in site.getsitepackages() if pathlib.Path(p, "transformers").is_dir()))
    farm = tmp_path / "site-packages"
    farm.mkdir()
    for entry in installed.iterdir():
        if entry.name != hidden and not re.fullmatch(rf"{hidden}-[^-]+\.dist-info", entry.name):
            (farm / entry.name).symlink_to(entry)
    return farm


def test_transformers_from_the_repository_root_sees_no_kernels_package(tmp_path):
    """transformers probes for Hugging Face's `kernels` package; on a machine without it, from the
    root (on sys.path first) the project's kernels/ folder must not pass for it, nor need jax."""
    probe = ("import sys\n"
             "for name in ('jax', 'jaxlib', 'flax'):\n"
             "    sys.modules[name] = None\n"
             "from transformers import GPT2LMHeadModel, LlamaForCausalLM\n"
             "from transformers.utils.import_utils import is_kernels_available\n"
             "print(sys.path[0] == '', is_kernels_available())")
    env = {**os.environ, "PYTHONPATH": str(_site_packages_without(tmp_path, "kernels"))}
    # -S: no site-packages but the linked copy (and no .pth files, which the probe does not need)
    proc = subprocess.run([sys.executable, "-S", "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["True", "False"]


def test_an_installed_kernels_package_wins_over_the_root_folder(tmp_path):
    installed = tmp_path / "site-packages" / "kernels"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("__version__ = '0.17.1'\n")
    env = {**refusing_env(tmp_path / "site", names=())}
    env["PYTHONPATH"] += f":{tmp_path / 'site-packages'}"  # after the root, as site-packages is
    proc = subprocess.run([sys.executable, "-c", "import sys, kernels; print(sys.path[0] == '', kernels.__file__)"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.split() == ["True", str(installed / "__init__.py")]


def test_importing_the_package_and_its_config_has_no_side_effects():
    probe = ("import os, sys\n"
             "env, fd2 = dict(os.environ), os.fstat(2)\n"
             "import andrea_jax, andrea_jax.config, andrea_jax.configs, andrea_jax.errors, andrea_jax.startup\n"
             "import andrea_jax.commands\n"
             "cfg = andrea_jax.config.validate(andrea_jax.configs.load('tiny'))\n"
             "same_fd2 = (os.fstat(2).st_ino, os.fstat(2).st_dev) == (fd2.st_ino, fd2.st_dev)\n"
             "print('jax' in sys.modules, dict(os.environ) == env, same_fd2)")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=True)
    assert proc.stdout.split() == ["False", "True", "True"], proc.stdout + proc.stderr
    assert proc.stderr == ""


def test_what_plans_runs_and_reads_their_files_starts_no_jax():
    """The sweep, ladder and report commands start training processes and read run folders; jax stays
    out of them (a second of start-up each, and the CUDA plugin's lines where there is no driver)."""
    probe = ("import sys\n"
             "import andrea_jax.workdir, andrea_jax.repro.sweep, andrea_jax.repro.ladder, andrea_jax.repro.report\n"
             "print('jax' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=True)
    assert proc.stdout.split() == ["False"], proc.stdout + proc.stderr
