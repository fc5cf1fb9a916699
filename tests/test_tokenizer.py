"""The byte-level BPE: exactly 8449 tokens, lossless on any Unicode string, a stable end-of-text id."""
import json
import random

import pytest

from andrea_jax.data import pipeline, tokenizer as tok_lib


@pytest.fixture(scope="module")
def shakespeare_tok(tmp_path_factory):
    text = pipeline.read_text(pipeline.EMBEDDED_CORPUS)
    return tok_lib.load_or_train_at(tmp_path_factory.mktemp("cache") / "tokenizer.json", [text], 8449)


def test_vocab_is_256_bytes_8192_merges_and_end_of_text(shakespeare_tok):
    assert shakespeare_tok.get_vocab_size() == 8449
    merges = json.loads(shakespeare_tok.to_str())["model"]["merges"]
    assert len(merges) == 8192
    assert tok_lib.eot_id(shakespeare_tok) == 0


def random_unicode(rng, n):
    # Any code point but the surrogates, which no valid str -> UTF-8 string can hold.
    chars = []
    while len(chars) < n:
        c = rng.choice([rng.randrange(0, 0x80), rng.randrange(0x80, 0x800),
                        rng.randrange(0x800, 0x10000), rng.randrange(0x10000, 0x110000)])
        if not 0xD800 <= c <= 0xDFFF:
            chars.append(chr(c))
    return "".join(chars)


def test_round_trip_on_random_unicode(shakespeare_tok):
    rng = random.Random(0)
    samples = [random_unicode(rng, rng.randrange(0, 200)) for _ in range(300)]
    samples += ["", " ", "  leading and trailing  ", "\n\n\t", "<|endoftext|>", "a<|endoftext|>b",
                "ROMEO:\nBut, soft! what light", "\x00\x01\xff", "🎉 日本語 Ünïcödé"]
    for s in samples:
        assert tok_lib.decode(shakespeare_tok, tok_lib.encode(shakespeare_tok, s)) == s, repr(s)


def test_end_of_text_is_one_token_with_the_same_id_on_any_corpus(shakespeare_tok, tmp_path):
    other = tok_lib.train(["completely different text " * 50 + random_unicode(random.Random(1), 3000)], 400)
    for tok in (shakespeare_tok, other):
        assert tok_lib.encode(tok, "<|endoftext|>") == [0]
        assert tok_lib.eot_id(tok) == 0


def test_cache_returns_the_same_tokenizer(tmp_path):
    text = pipeline.read_text(pipeline.EMBEDDED_CORPUS)[:200_000]
    first = tok_lib.load_or_train_at(tmp_path / "tokenizer.json", [text], 1000)
    assert [p.name for p in tmp_path.iterdir()] == ["tokenizer.json"]  # saved whole, no temporary left
    second = tok_lib.load_or_train_at(tmp_path / "tokenizer.json", iter(()), 1000)  # read, not retrained
    assert first.to_str() == second.to_str()


def test_too_small_corpus_for_the_vocabulary_fails_clearly():
    with pytest.raises(ValueError, match="BPE merges"):
        tok_lib.train(["ab ab ab"], 8449)


def test_bytes_per_token_counts_the_utf8_bytes_of_any_text(tok_path):
    tok = tok_lib.load(tok_path)
    counts = tok_lib.bytes_per_token(tok)
    assert counts[tok_lib.eot_id(tok)] == 0
    for text in ["plain ascii", "Héllo, wörld — 日本語 ✓\n", "emoji 🙂 and tabs\t"]:
        ids = tok_lib.encode(tok, text + tok_lib.EOT)
        assert int(counts[ids].sum()) == len(text.encode("utf-8"))
