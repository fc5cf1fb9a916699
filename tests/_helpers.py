"""Helpers several test modules share: a model's parameters moved off their init, its logits from a
plain forward pass and from a KV cache filled a token at a time; a project command run in a
subprocess from the repository root, or started with SIGINT ignored, train.py's command line,
waiting for a started process to print something, and a checkpoint's saved state damaged."""
import functools
import pathlib
import subprocess
import sys
import time

import jax
import jax.numpy as jnp

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


@functools.partial(jax.jit, static_argnums=0)
def forward_logits(model, params, tokens_BT, alphas_L):
    """The logits of one plain forward pass, compiled once per model and shape."""
    return model.apply({"params": params}, tokens_BT, alphas_L).logits


def cached_logits(cfg, apply, params, tokens_BT, alphas, prefill_len):
    """Logits at every position: a prefill of prefill_len tokens, then one token at a time, each call
    apply(params, tokens, alphas, cache) -> (logits, _, (k, v)). The cache's index and positions are
    int32 at every step, so a jitted apply compiles two shapes, the prefill's and the steps'."""
    B, T = tokens_BT.shape
    k, v = model_lib.empty_cache(cfg, B)
    valid = jnp.zeros((B, cfg.seq_len), bool).at[:, :prefill_len].set(True)
    positions = jnp.broadcast_to(jnp.arange(prefill_len, dtype=jnp.int32), (B, prefill_len))
    logits, _, (k, v) = apply(params, tokens_BT[:, :prefill_len], alphas, model_lib.KVCache(k, v, 0, positions, valid))
    out = [logits]
    for t in range(prefill_len, T):
        valid = valid.at[:, t].set(True)
        cache = model_lib.KVCache(k, v, jnp.int32(t), jnp.full((B, 1), t, jnp.int32), valid)
        logits, _, (k, v) = apply(params, tokens_BT[:, t:t + 1], alphas, cache)
        out.append(logits)
    return jnp.concatenate(out, axis=1)


def train_command(workdir, settings, *flags, config="tiny"):
    """train.py's command line: `config` trained in `workdir`, with `flags`, each of `settings` a --set."""
    cmd = [sys.executable, str(ROOT / "train.py"), "--config", str(config), "--workdir", str(workdir), *flags]
    for s in settings:
        cmd += ["--set", s]
    return cmd


def wait_for_text(proc, text, timeout=120):
    """Waits for `text` anywhere in the file proc.log that a started process writes its output to;
    anywhere, not only at a line's start: a progress bar on stderr, in the same file, leaves no line
    break before what the process prints next. Fails if the process ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while text not in pathlib.Path(proc.log).read_text():
        assert time.monotonic() < deadline and proc.poll() is None, pathlib.Path(proc.log).read_text()[-2000:]
        time.sleep(0.01)


def damage(step_dir, how):
    """Overwrites (how="garbage") or cuts to a third ("truncated") every data file of the train state
    saved in step_dir; returns {file: its new bytes}."""
    files = [f for f in (step_dir / "state").rglob("*") if f.is_file() and f.parent.name == "d"]
    assert files
    for f in files:
        f.write_bytes(b"not a checkpoint" if how == "garbage" else f.read_bytes()[: len(f.read_bytes()) // 3])
    return {f: f.read_bytes() for f in files}
