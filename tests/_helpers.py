"""Helpers several test modules share: a model's parameters moved off their init, and a project
command run in a subprocess from the repository root, or started with SIGINT ignored."""
import pathlib
import subprocess
import sys

import jax

from andrea_jax import model as model_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "tests" / "programs"
# Command prefixes: what follows runs with SIGINT ignored, or at its default, whatever the test
# runner's own disposition is (tests/programs/with_sigint.py).
IGNORING_SIGINT = [sys.executable, str(PROGRAMS / "with_sigint.py"), "ignore"]
DEFAULT_SIGINT = [sys.executable, str(PROGRAMS / "with_sigint.py"), "default"]


def perturbed_params(cfg, seed=0, scale=0.1):
    """Init plus `scale` times standard normal noise on every leaf, so that LayerNorm gains and
    biases, biases and gates all matter."""
    params = model_lib.init(cfg, jax.random.key(seed))["params"]
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    return jax.tree.unflatten(tree, [p + scale * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)])


def run_module(module, *args, timeout=300, **kwargs):
    """The command `module` (run with -m) with `args`, from the repository root, its output captured as text."""
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, **kwargs)
