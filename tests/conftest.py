"""Fixtures shared by several test modules."""
import pytest

from andrea_jax.data import pipeline, tokenizer as tok_lib


@pytest.fixture(scope="session")
def tok_path(tmp_path_factory):
    """A small tokenizer (300 tokens) trained once, so most tests need not train their own."""
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok_lib.train([pipeline.read_text(pipeline.EMBEDDED_CORPUS)[:100_000]], 300).save(str(path))
    return path
