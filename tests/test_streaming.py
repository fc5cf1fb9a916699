"""data.pretokenize=false: grain worker processes tokenize and pack documents on the fly; the
iterator's state resumes exactly where it stopped."""
import json

import numpy as np
import pytest

from andrea_jax import config as config_lib, configs
from andrea_jax.data import pipeline, tokenizer as tok_lib
from andrea_jax.errors import DataError

SHAKESPEARE = pipeline.read_text(pipeline.EMBEDDED_CORPUS)
DOCS = [p for p in SHAKESPEARE[:60_000].split("\n\n") if p.strip()]


def streaming_cfg(corpus, tok_path, workers=2, **sets):
    cfg = configs.load("tiny")
    pairs = {"data.source": "files", "data.path": str(corpus), "data.tokenizer": str(tok_path),
             "data.pretokenize": "false", "data.stream_workers": str(workers), "model.vocab_size": "300",
             "model.seq_len": "16", "train.batch_size": "4", "train.eval_batches": "2", **sets}
    return config_lib.validate(config_lib.override(cfg, [f"{k}={v}" for k, v in pairs.items()]))


def test_streaming_packs_documents_and_resumes_where_it_stopped(tmp_path, tok_path):
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    cfg = streaming_cfg(tmp_path / "corpus.jsonl", tok_path)
    corpus, batches, val = pipeline.build(cfg, cache_dir=tmp_path / "cache")
    tok = tok_lib.load(tok_path)
    eot = tok_lib.eot_id(tok)
    n_val = int(len(DOCS) * cfg.data.val_fraction)
    assert corpus.train_documents == len(DOCS) - n_val
    assert "training documents" in corpus.train_size

    # Every window is seq_len + 1 tokens of the training documents' encodings, end-of-text after each.
    encoded = [tok_lib.encode(tok, d) for d in DOCS[:len(DOCS) - n_val]]
    haystack = "| " + " | ".join(" ".join(map(str, ids)) for ids in encoded) + " |"
    first = [next(batches) for _ in range(5)]
    for batch in first:
        assert batch.shape == (4, 17) and batch.dtype == np.int32
        for row in batch:
            pieces = " ".join(map(str, row)).split(f" {eot} ") if eot in row else [" ".join(map(str, row))]
            for piece in pieces:
                piece = piece.removeprefix(f"{eot} ").removesuffix(f" {eot}")
                if piece and piece != str(eot):
                    assert f" {piece} " in haystack, piece   # whole ids, inside one document
    # The validation set: the held-out tail documents, tokenized once, in order.
    want_val = np.concatenate([tok_lib.encode(tok, d) + [eot] for d in DOCS[len(DOCS) - n_val:]])
    np.testing.assert_array_equal(np.concatenate(val)[:, :-1].ravel(), want_val[:len(val) * 4 * 16])

    state = pipeline.get_state(batches, cfg, corpus)
    json.dumps(state)
    expected = [next(batches) for _ in range(4)]

    corpus2, resumed, _ = pipeline.build(cfg, cache_dir=tmp_path / "cache")
    pipeline.set_state(resumed, cfg, corpus2, state)
    for want in expected:
        np.testing.assert_array_equal(next(resumed), want)

    # A state from another worker count is refused by name, not silently misread.
    other = streaming_cfg(tmp_path / "corpus.jsonl", tok_path, workers=1)
    corpus3, third, _ = pipeline.build(other, cache_dir=tmp_path / "cache")
    with pytest.raises(DataError, match=r"belongs to other data or batching \(tokens: saved .*:stream:2-workers"):
        pipeline.set_state(third, other, corpus3, state)
    for it in (batches, resumed, third):
        it.close() if hasattr(it, "close") else None


def test_streaming_is_refused_for_a_prepared_dataset():
    with pytest.raises(config_lib.ConfigError, match="data.pretokenize: must be true with data.source=prepared"):
        config_lib.validate(config_lib.override(configs.load("tiny"), [
            "data.source=prepared", "data.path=/x", "data.pretokenize=false"]))
