"""The data path from files to packed tokens: the TFDS builder, pretokenization and its cache,
the TFDS source, and training from a local folder through train.py."""
import hashlib
import json
import os
import sys
import tempfile

import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorflow_datasets as tfds

import train as train_cli
from _corpus import SHAKESPEARE, write_nested_corpus
from andrea_jax import checkpoint
from andrea_jax import config as config_lib, configs
from andrea_jax.data import loader, pipeline, sampling, token_cache, token_shards, tokenizer as tok_lib


@pytest.fixture
def cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("ANDREA_CACHE", str(cache))
    return cache


def files_cfg(path, **kw):
    return config_lib.DataConfig(source="files", path=str(path), **kw)


def test_local_folder_every_document_in_order_separated_by_end_of_text(tmp_path, cache, tok_path):
    docs = write_nested_corpus(tmp_path / "corpus")
    corpus = pipeline.tokenized_corpus(files_cfg(tmp_path / "corpus", tokenizer=str(tok_path)),
                              vocab_size=300, seq_len=16, cache_dir=cache)
    stream = np.concatenate([corpus.train_tokens, corpus.val_tokens])
    tok = tok_lib.load(tok_path)
    expected = np.concatenate([tok_lib.encode(tok, d) + [tok_lib.eot_id(tok)] for d in docs])
    np.testing.assert_array_equal(stream, expected)
    assert (stream == tok_lib.eot_id(tok)).sum() == len(docs)

    # The packed windows read the same stream, in order, overlapping by one token.
    n = loader.num_windows(len(stream), 16)
    windows = loader.gather_windows(stream, np.arange(n), 16)
    assert windows.shape == (n, 17) and windows.dtype == np.int32
    np.testing.assert_array_equal(windows[:, :-1].ravel(), stream[: n * 16])
    np.testing.assert_array_equal(windows[1:, 0], windows[:-1, -1])

    # The dataset is a plain TFDS array_record dataset: TFDS reads it back without our builder class.
    dataset_dir = cache / "tfds" / "andrea_text_files"
    (version_dir,) = dataset_dir.glob("*/1.0.0")
    assert list(version_dir.glob("*.array_record-*"))
    records = tfds.builder_from_directory(str(version_dir)).as_data_source(split="train")
    assert [r["text"].decode() for r in records] == docs
    assert "tensorflow" not in sys.modules


def test_a_build_leaves_no_temporary_folder_behind(tmp_path, cache, tok_path, monkeypatch):
    # TFDS looks a dataset it has not built up in its public bucket through a folder it never removes
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    write_nested_corpus(tmp_path / "corpus")
    pipeline.tokenized_corpus(files_cfg(tmp_path / "corpus", tokenizer=str(tok_path)), vocab_size=300, seq_len=8,
                              cache_dir=cache)
    assert list(temp.iterdir()) == []


def test_validation_set_is_the_fixed_tail(tmp_path, cache, tok_path):
    write_nested_corpus(tmp_path / "corpus")
    cfg = files_cfg(tmp_path / "corpus", tokenizer=str(tok_path), val_fraction=0.25)
    first = pipeline.tokenized_corpus(cfg, vocab_size=300, seq_len=8, cache_dir=cache)
    n = len(first.train_tokens) + len(first.val_tokens)
    assert len(first.val_tokens) == int(n * 0.25)
    again = pipeline.tokenized_corpus(cfg, vocab_size=300, seq_len=8, cache_dir=cache)
    np.testing.assert_array_equal(first.val_tokens, again.val_tokens)
    val = loader.val_batches(first.val_tokens, seq_len=8, global_batch=4, max_batches=3)
    np.testing.assert_array_equal(np.concatenate(val), loader.gather_windows(first.val_tokens, np.arange(12), 8))


def counting(monkeypatch, module, name):
    calls = []
    original = getattr(module, name)

    def wrapped(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)
    return calls


def test_second_build_reads_the_cache_and_tokenizes_nothing(tmp_path, cache, monkeypatch):
    write_nested_corpus(tmp_path / "corpus")
    cfg = files_cfg(tmp_path / "corpus")
    encodes = counting(monkeypatch, token_cache, "encode_batch")
    trains = counting(monkeypatch, tok_lib, "train")
    first = pipeline.tokenized_corpus(cfg, vocab_size=300, seq_len=8, cache_dir=cache)
    assert len(encodes) > 0 and len(trains) == 1
    encodes.clear(), trains.clear()
    second = pipeline.tokenized_corpus(cfg, vocab_size=300, seq_len=8, cache_dir=cache)
    assert encodes == [] and trains == []
    assert isinstance(second.train_tokens, token_shards.ShardedTokens)   # read from the cache
    np.testing.assert_array_equal(first.train_tokens, second.train_tokens)
    assert first.key == second.key

    # A cache in an older token format (the raw .bin files before array_record) is remade, not misread.
    (manifest,) = cache.glob("tfds/andrea_text_files/*/1.0.0/tokens-train-*/manifest.json")
    manifest.write_text(json.dumps({"format": "andrea-tokens/1"}))
    (manifest.parent / "tokens-old-00000-of-00001.bin").write_bytes(b"\0" * 10)
    remade = pipeline.tokenized_corpus(cfg, vocab_size=300, seq_len=8, cache_dir=cache)
    assert len(encodes) > 0 and not (manifest.parent / "tokens-old-00000-of-00001.bin").exists()
    np.testing.assert_array_equal(remade.train_tokens, first.train_tokens)
    encodes.clear()

    # Keyed by the tokenizer: another tokenizer tokenizes again, into a second cache file.
    other = tmp_path / "other.json"
    tok_lib.train([SHAKESPEARE[200_000:300_000]], 300).save(str(other))
    third = pipeline.tokenized_corpus(files_cfg(tmp_path / "corpus", tokenizer=str(other)), vocab_size=300,
                             seq_len=8, cache_dir=cache)
    assert len(encodes) > 0 and third.key != first.key
    assert len(list(cache.glob("tfds/andrea_text_files/*/1.0.0/tokens-train-*/manifest.json"))) == 2

    # Keyed by the source: a changed file builds a new dataset beside the old one.
    encodes.clear()
    with (tmp_path / "corpus" / "a.txt").open("a") as f:
        f.write("\nA NEW LINE AT THE END.")
    fourth = pipeline.tokenized_corpus(cfg, vocab_size=300, seq_len=8, cache_dir=cache)
    assert len(encodes) > 0
    assert len(list(cache.glob("tfds/andrea_text_files/*/1.0.0"))) == 2
    assert len(fourth.train_tokens) + len(fourth.val_tokens) > len(first.train_tokens) + len(first.val_tokens)


class AndreaTestDocs(tfds.core.GeneratorBasedBuilder):
    """A registered TFDS text dataset with train and test splits, standing in for lm1b."""

    VERSION = tfds.core.Version("1.0.0")

    @tfds.core.utils.classproperty
    @classmethod
    def url_infos(cls):  # see andrea_jax/data/tfds_builder.py
        return None

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, disable_shuffling=True, features=tfds.features.FeaturesDict(
            {"text": tfds.features.Text(), "label": tfds.features.Tensor(shape=(), dtype=np.int32)}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(0, 40), "test": self._generate_examples(40, 50)}

    def _generate_examples(self, lo, hi):
        for i in range(lo, hi):
            yield i, {"text": SHAKESPEARE[i * 500:(i + 1) * 500], "label": i}


def docs_tokens(tok, lo, hi):
    """AndreaTestDocs' documents lo..hi-1 tokenized, each followed by end-of-text."""
    return np.concatenate([tok_lib.encode(tok, SHAKESPEARE[i * 500:(i + 1) * 500]) + [0] for i in range(lo, hi)])


def test_tfds_source_reads_the_train_and_validation_splits(tmp_path, cache, tok_path):
    AndreaTestDocs(data_dir=str(tmp_path / "tfds"), file_format="array_record").download_and_prepare()
    cfg = config_lib.DataConfig(source="tfds", tfds_name="andrea_test_docs", tfds_split="train",
                                tfds_val_split="test", data_dir=str(tmp_path / "tfds"),
                                tokenizer=str(tok_path))
    corpus = pipeline.tokenized_corpus(cfg, vocab_size=300, seq_len=16, cache_dir=cache)
    tok = tok_lib.load(tok_path)

    np.testing.assert_array_equal(corpus.train_tokens, docs_tokens(tok, 0, 40))
    np.testing.assert_array_equal(corpus.val_tokens, docs_tokens(tok, 40, 50))
    # The caches sit beside the prepared dataset.
    assert len(list((tmp_path / "tfds" / "andrea_test_docs" / "1.0.0").glob("tokens-*/manifest.json"))) == 2


def tiny_overrides(workdir, corpus_dir, steps):
    sets = ["data.source=files", f"data.path={corpus_dir}", "model.vocab_size=300", "model.seq_len=16",
            "model.d_model=32", "model.n_layer=2", "model.n_head=2", "train.batch_size=4",
            f"train.steps={steps}", "train.log_every=2", "train.eval_every=0", "train.eval_batches=2",
            "train.sample_tokens=0"]
    return ["--config", "tiny", "--workdir", str(workdir)] + [a for s in sets for a in ("--set", s)]


def test_training_from_a_local_folder_through_train_py(tmp_path, cache, capsys):
    write_nested_corpus(tmp_path / "corpus")
    (tmp_path / "corpus" / "more.txt").write_text(SHAKESPEARE[20_000:120_000])
    argv = tiny_overrides(tmp_path / "run", tmp_path / "corpus", steps=4)
    assert train_cli.main(argv) == 0, capsys.readouterr().err
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [2, 4] and np.isfinite(lines[-1]["val_loss"])
    assert tok_lib.load(tmp_path / "run" / "tokenizer.json").get_vocab_size() == 300

    # The run's last checkpoint holds the loader's state: restoring it gives the batch step 5 would read.
    with checkpoint.manager(tmp_path / "run", max_to_keep=10) as mngr:
        state = mngr.restore(mngr.latest_step(), args=ocp.args.Composite(data=ocp.args.JsonRestore())).data
    assert state["grain"] == {"next_index": 4}
    cfg = config_lib.override(configs.load("tiny"), [a for a in argv[4:] if a != "--set"])
    _, fresh, _ = pipeline.build(cfg)
    for _ in range(4):
        next(fresh)
    corpus, resumed, _ = pipeline.build(cfg)
    pipeline.set_state(resumed, cfg, corpus, state)
    np.testing.assert_array_equal(next(resumed), next(fresh))


def test_a_trained_tokenizer_is_named_by_its_split_vocabulary_and_sample(tmp_path, cache, monkeypatch):
    write_nested_corpus(tmp_path / "corpus")
    asked = []
    sample = sampling.sample_texts
    monkeypatch.setattr(sampling, "sample_texts", lambda records, max_chars, seed=0: (
        asked.append(max_chars), sample(records, max_chars, seed))[1])
    pipeline.tokenized_corpus(files_cfg(tmp_path / "corpus"), vocab_size=300, seq_len=8, cache_dir=cache)
    pipeline.tokenized_corpus(files_cfg(tmp_path / "corpus", tokenizer_sample_mb=1), vocab_size=300, seq_len=8,
                              cache_dir=cache)
    assert asked == [64 << 20, 1 << 20]
    (dataset,) = cache.glob("tfds/andrea_text_files/*/1.0.0")
    assert sorted(p.name for p in dataset.glob("tokenizer-*.json")) == ["tokenizer-train-v300-s1mb.json",
                                                                        "tokenizer-train-v300.json"]


def test_the_token_cache_moves_into_the_cache_folder_when_the_dataset_is_read_only(tmp_path, cache, tok_path,
                                                                                    monkeypatch):
    write_nested_corpus(tmp_path / "corpus")
    cfg = files_cfg(tmp_path / "corpus", tokenizer=str(tok_path))
    writable = pipeline.tokenized_corpus(cfg, vocab_size=300, seq_len=8, cache_dir=cache)
    (dataset,) = cache.glob("tfds/andrea_text_files/*/1.0.0")
    monkeypatch.setattr(pipeline.os, "access", lambda path, mode: not (mode == os.W_OK and path == dataset))
    read_only = pipeline.tokenized_corpus(cfg, vocab_size=300, seq_len=8, cache_dir=cache)
    beside = cache / "tokens" / hashlib.sha256(str(dataset).encode()).hexdigest()[:16]
    assert len(list(beside.glob("tokens-train-*/manifest.json"))) == 1
    np.testing.assert_array_equal(read_only.train_tokens, writable.train_tokens)


def test_the_corpus_key_names_the_split_but_not_the_folder(tmp_path, tok_path):
    # One data_dir, and a copy of it moved elsewhere.
    for where in ("a", "moved"):
        AndreaTestDocs(data_dir=str(tmp_path / where / "tfds"), file_format="array_record").download_and_prepare()
    open_ = lambda where, split: pipeline.tokenized_corpus(
        config_lib.DataConfig(source="tfds", tfds_name="andrea_test_docs", tfds_split=split, tfds_val_split="",
                              data_dir=str(tmp_path / where / "tfds"), tokenizer=str(tok_path)),
        vocab_size=300, seq_len=16, cache_dir=tmp_path / "cache")
    train_a, test_a, train_b = open_("a", "train"), open_("a", "test"), open_("moved", "train")
    assert train_a.key == train_b.key != test_a.key
    tok = tok_lib.load(tok_path)
    np.testing.assert_array_equal(np.concatenate([test_a.train_tokens, test_a.val_tokens]), docs_tokens(tok, 40, 50))
