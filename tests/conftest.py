"""Fixtures shared by several test modules."""
import os

import pytest

from andrea_jax.data import pipeline, tokenizer as tok_lib


@pytest.fixture(scope="session")
def tok_path(tmp_path_factory):
    """A small tokenizer (300 tokens) trained once, so most tests need not train their own."""
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok_lib.train([pipeline.read_text(pipeline.EMBEDDED_CORPUS)[:100_000]], 300).save(str(path))
    return path


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, tok_path):
    """make(*overrides, steps=6) -> the workdir of a short run of a 3-block toy on the embedded
    corpus, checkpointed every 3 steps; with prores.warmup=4 its alphas at step 6 are
    [1, 0.75, 0.5] (mid-warmup). Runs are cached per arguments within a test process."""
    from andrea_jax import config as config_lib
    from andrea_jax.train import loop as trainer

    made = {}

    def make(*overrides, steps=6):
        key = (overrides, steps)
        if key not in made:
            workdir = tmp_path_factory.mktemp("run")
            cfg = config_lib.validate(config_lib.override(config_lib.load("tiny"), [
                f"train.steps={steps}", "train.checkpoint_every=3", "train.eval_every=0",
                "train.sample_tokens=0", "train.batch_size=4", "model.n_layer=3", "model.d_model=32",
                "model.n_head=4", "model.seq_len=32", "model.vocab_size=300", "prores.schedule=linear", "prores.warmup=4",
                f"data.tokenizer={tok_path}", "diagnostics.tensorboard=false", *overrides]))
            saved_cache = os.environ.get("ANDREA_CACHE")
            os.environ["ANDREA_CACHE"] = str(tmp_path_factory.mktemp("cache"))  # its own token cache
            try:
                trainer.train(cfg, workdir, show_progress=False)
            finally:
                if saved_cache is None:
                    os.environ.pop("ANDREA_CACHE")
                else:
                    os.environ["ANDREA_CACHE"] = saved_cache
            made[key] = workdir
        return made[key]

    return make


@pytest.fixture(autouse=True)
def own_andrea_cache(tmp_path_factory, monkeypatch):
    """Every test (and every process it starts) gets its own empty ANDREA_CACHE: no test reads a
    tokenizer or token file another test or an earlier session left behind."""
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path_factory.mktemp("andrea_cache")))
