"""Writes the golden files that tests/test_golden.py compares today's code against, on the CPU.

    python scripts/golden.py losses        tests/data/golden_losses.json: the first 20 losses of a
                                           fixed tiny run (rewrite it when a change moves them on purpose)
    python scripts/golden.py checkpoint    tests/data/golden_checkpoint_vN/ (N: the current
                                           andrea_jax.checkpoint.FORMAT_VERSION) and its expected.json

A golden checkpoint is written once per format version and then kept: every later version must
restore it (or refuse it in one line naming its version). Both runs use tests/data/tokenizer.json,
written here if missing, so that they do not depend on how a tokenizer is trained.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from andrea_jax import checkpoint, config as config_lib, configs, model as model_lib  # noqa: E402
from andrea_jax.data import pipeline, tokenizer as tok_lib  # noqa: E402
from andrea_jax.train import loop as trainer  # noqa: E402

DATA = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data"
TOKENIZER, LOSSES = DATA / "tokenizer.json", DATA / "golden_losses.json"
TOY = ["model.vocab_size=300", "model.seq_len=16", "model.d_model=16", "model.n_head=2", "model.n_layer=2",
       "train.batch_size=4", "train.eval_every=0", "train.sample_tokens=0", "train.log_every=1",
       "diagnostics.tensorboard=false", "prores.schedule=linear", "prores.warmup=4"]
GOLDEN_STEPS = 20
CHECKPOINT_STEP = 2   # the golden checkpoint's step; the test trains step CHECKPOINT_STEP + 1 from it


def tokenizer() -> pathlib.Path:
    if not TOKENIZER.is_file():
        tok_lib.train([pipeline.read_text(pipeline.EMBEDDED_CORPUS)[:100_000]], 300).save(str(TOKENIZER))
    return TOKENIZER


def run_config(tree: dict) -> config_lib.Config:
    """The config saved in a golden file, reading its tokenizer from tests/data."""
    return config_lib.validate(config_lib.override(configs.from_dict(tree), [f"data.tokenizer={tokenizer()}"]))


def params_sha256(params) -> str:
    """A checksum of the parameters' bytes, in the tree's order."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return digest.hexdigest()


def read_params(step_dir: pathlib.Path, cfg: config_lib.Config):
    shapes = model_lib.param_shapes(cfg.model)
    return checkpoint.read_params(step_dir, jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), shapes))


def losses_config() -> dict:
    cfg = config_lib.override(configs.load("tiny"), TOY + [f"train.steps={GOLDEN_STEPS}", "train.checkpoint_every=0",
                                                           f"data.tokenizer={tokenizer()}"])
    return config_lib.validate(cfg).to_dict()


def train_losses(tree: dict, workdir: pathlib.Path) -> list[float]:
    return [line["loss"] for line in trainer.train(run_config(tree), workdir, show_progress=False)]


def write_losses(workdir: pathlib.Path) -> None:
    tree = losses_config()
    LOSSES.write_text(json.dumps({"config": tree, "losses": train_losses(tree, workdir)}, indent=1) + "\n")
    print(f"wrote {LOSSES}")


def write_checkpoint(workdir: pathlib.Path) -> None:
    out = DATA / f"golden_checkpoint_v{checkpoint.FORMAT_VERSION}"
    if out.exists():
        sys.exit(f"{out} exists: a golden checkpoint is kept as written; delete it to write it again")
    cfg = config_lib.validate(config_lib.override(configs.load("tiny"), TOY + [
        f"train.steps={CHECKPOINT_STEP + 1}", f"train.checkpoint_every={CHECKPOINT_STEP}",
        f"data.tokenizer={tokenizer()}"]))
    lines = trainer.train(cfg, workdir, show_progress=False)
    out.mkdir()
    shutil.copytree(workdir / "checkpoints" / str(CHECKPOINT_STEP), out / "checkpoints" / str(CHECKPOINT_STEP))
    shutil.copy(workdir / "config.json", out / "config.json")
    expected = {"step": CHECKPOINT_STEP, "format_version": checkpoint.FORMAT_VERSION,
                "params_sha256": params_sha256(read_params(out / "checkpoints" / str(CHECKPOINT_STEP), cfg)),
                "next_loss": lines[-1]["loss"]}
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"wrote {out}")


def main(argv: list[str]) -> int:
    if argv not in (["losses"], ["checkpoint"]):
        print(__doc__, file=sys.stderr)
        return 2
    os.environ.setdefault("ANDREA_CACHE", tempfile.mkdtemp(prefix="andrea_golden_cache_"))
    with tempfile.TemporaryDirectory() as tmp:
        (write_losses if argv == ["losses"] else write_checkpoint)(pathlib.Path(tmp) / "run")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
