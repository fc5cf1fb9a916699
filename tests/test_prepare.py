"""`python -m andrea_jax.data.prepare`: one Beam pipeline (DirectRunner, 2 worker processes, 3
shards) whose token ids equal the single-process path's document by document, and nothing left in
the temporary folder; idempotent reruns; an interrupted run completed on rerun; TFDS reads the
output as its own array_record dataset; the tokenizer's uniform sample; bad input in one line;
published files (hf-jsonl) and a TFDS dataset prepared and then trained on with data.source=prepared."""
import json
import os

import apache_beam  # noqa: F401  a test dependency (pyproject.toml's `test` extra): never skipped
import numpy as np
import pytest
import tensorflow_datasets as tfds

import train as train_cli
from _corpus import LAST_DOCUMENT, SHAKESPEARE, run_prepare, write_corpus
from andrea_jax import config as config_lib
from andrea_jax.data import pipeline, sampling, token_cache, token_shards, tokenizer as tok_lib
from andrea_jax.data.prepare import corpus_units, driver as prepare, pipelines
from andrea_jax.errors import DataError

PARAGRAPHS = [p for p in SHAKESPEARE[:300_000].split("\n\n") if p.strip()]


def shard_documents(out):
    """The prepared dataset's documents (token id lists), shard by shard, one per record."""
    tokens = token_shards.ShardedTokens.open(out)
    docs = [d.tolist() for s in range(len(tokens.files)) for d in tokens.shard_documents(s)]
    for s in range(len(tokens.files)):   # the index: each record's end offset in its shard
        np.testing.assert_array_equal(tokens.document_ends(s), np.cumsum([len(d) for d in tokens.shard_documents(s)]))
    return tokens, docs


def tokens_hash(out):
    return json.loads((out / "manifest.json").read_text())["tokenizer"]


def mtimes(out):
    return {p.name: p.stat().st_mtime_ns for p in out.iterdir()}


def test_beam_shards_equal_the_single_process_path_rerun_and_interruption(tmp_path, tok_path, capsys,
                                                                           empty_temporary_folder):
    write_corpus(tmp_path / "corpus", n_files=5, paragraphs=PARAGRAPHS)
    docs = [*PARAGRAPHS, LAST_DOCUMENT]
    out = tmp_path / "prepared"
    # Two worker processes; the reruns below run in this process, and must redo a shard byte for byte.
    assert run_prepare(tmp_path / "corpus", out, "--tokenizer", str(tok_path), workers=2) == 0, \
        capsys.readouterr().err
    assert not list(empty_temporary_folder.iterdir())  # Beam's runners leave folders there; a prepare removes them
    tok = tok_lib.load(tok_path)

    # Document by document, in corpus order: each document's own encoding followed by end-of-text.
    tokens, got = shard_documents(out)
    assert len(tokens.files) == 3 and all(c > 0 for c in tokens.counts)
    assert len(got) == len(docs)
    want = [tok_lib.encode(tok, text) + [tok_lib.eot_id(tok)] for text in docs]
    for i, (want_ids, ids) in enumerate(zip(want, got)):
        assert ids == want_ids, f"document {i}"

    # TFDS reads the output as its own dataset: K array_record shards it names, one record per
    # document, labelled by the tokenizer's hash; no TensorFlow involved.
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.file_format.value == "array_record" and builder.info.config_name == tokens_hash(out)
    assert builder.info.splits["train"].shard_lengths == [int(n) for n in tokens.documents]
    assert sorted(p.name for p in out.glob("andrea_tokens-train.array_record-*-of-00003")) == [
        f"andrea_tokens-train.array_record-{s:05d}-of-00003" for s in range(3)]
    source = builder.as_data_source("train")
    assert len(source) == len(docs)
    assert [source[i]["tokens"].tolist() for i in range(len(source))] == want

    # The same stream as the single-process path a training run takes on these files.
    cfg = config_lib.DataConfig(source="files", path=str(tmp_path / "corpus"), tokenizer=str(tok_path))
    flat = pipeline.tokenized_corpus(cfg, vocab_size=300, seq_len=8, cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(np.concatenate([flat.train_tokens, flat.val_tokens]), np.asarray(tokens))
    # ... and read as a prepared dataset, the same split into training and validation tokens.
    prepared = pipeline.tokenized_corpus(config_lib.DataConfig(source="prepared", path=str(out)),
                                vocab_size=300, seq_len=8, cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(np.asarray(prepared.train_tokens), flat.train_tokens)
    np.testing.assert_array_equal(np.asarray(prepared.val_tokens), flat.val_tokens)
    capsys.readouterr()

    # A rerun on the complete output does nothing: no pipeline, no file touched.
    before = mtimes(out)
    stream = np.asarray(tokens).copy()
    assert run_prepare(tmp_path / "corpus", out, "--tokenizer", str(tok_path)) == 0
    assert "is complete" in capsys.readouterr().out
    assert mtimes(out) == before

    # Interrupted: no manifest yet, shard 1 lost with its marker, shard 2 cut short under its marker.
    (out / token_shards.MANIFEST).unlink()
    (out / tokens.files[1]).unlink()
    (out / token_shards.marker_file(tokens.files[1])).unlink()
    with open(out / tokens.files[2], "r+b") as f:
        f.truncate(100)
    (out / f"{tokens.files[1]}.tmp4242").write_bytes(b"half a shard")   # as a killed worker leaves it
    assert run_prepare(tmp_path / "corpus", out, "--tokenizer", str(tok_path)) == 0
    assert not list(out.glob("*.tmp*"))
    assert '"shards_tokenized": 2' in capsys.readouterr().out
    after = mtimes(out)
    assert after[tokens.files[0]] == before[tokens.files[0]]   # the complete shard was not redone
    assert after[tokens.files[1]] != before[tokens.files[1]]
    np.testing.assert_array_equal(np.asarray(token_shards.ShardedTokens.open(out)), stream)

    # A shard damaged after completion (the manifest still there): the rerun redoes that one.
    with open(out / tokens.files[0], "r+b") as f:
        f.truncate(10)
    assert run_prepare(tmp_path / "corpus", out, "--tokenizer", str(tok_path)) == 0
    printed = capsys.readouterr().out
    assert f"token shard {out / tokens.files[0]} has 10 bytes" in printed and '"shards_tokenized": 1' in printed
    np.testing.assert_array_equal(np.asarray(token_shards.ShardedTokens.open(out)), stream)


def test_trained_tokenizer_sees_a_uniform_sample_from_the_whole_corpus(tmp_path, capsys):
    write_corpus(tmp_path / "corpus", n_files=5, paragraphs=PARAGRAPHS)
    docs = [*PARAGRAPHS, LAST_DOCUMENT]
    n_sample = 300  # of 2097 documents
    assert run_prepare(tmp_path / "corpus", tmp_path / "out", "--vocab-size", "400", "--tokenizer-docs",
               str(n_sample)) == 0, capsys.readouterr().err
    # The reference sample: the documents of smallest seeded key, independently of Beam.
    counts = [len(PARAGRAPHS[f * len(PARAGRAPHS) // 5:(f + 1) * len(PARAGRAPHS) // 5]) for f in range(5)] + [1]
    ids = [sampling.doc_id(u, j) for u, n in enumerate(counts) for j in range(n)]   # (file, document)
    chosen = sorted(np.argsort(sampling.keys(ids, 0), kind="stable")[:n_sample])
    assert max(chosen) > len(docs) * 0.9        # documents from the end of the corpus are in it
    assert min(chosen) < len(docs) * 0.1
    want = tok_lib.train([docs[i] for i in chosen], 400)
    got = tok_lib.load(tmp_path / "out" / "tokenizer.json")
    assert got.to_str() == want.to_str()
    # The tokenizer's hash names the dataset (TFDS's config name) and labels the manifest and shards.
    out = tmp_path / "out"
    tok_hash = tokens_hash(out)
    assert tok_hash == token_cache.tokenizer_hash(got)
    assert tfds.builder_from_directory(str(out)).info.config_name == tok_hash
    assert all(json.loads(p.read_text())["tokenizer"] == tok_hash for p in out.glob("*.done.json"))


def test_sample_texts_is_seeded_uniform_and_keeps_a_small_corpus_whole():
    records = [{"text": f"document {i:04d}."} for i in range(2000)]   # 14 characters each
    picked = [int(t[9:13]) for t in sampling.sample_texts(records, 200 * 14, seed=0)]
    assert len(picked) == 200 and picked == sorted(picked)
    assert max(picked) >= 1800 and min(picked) < 200            # from the whole corpus, end included
    deciles = np.bincount(np.asarray(picked) // 200, minlength=10)
    assert deciles.min() >= 8, deciles                          # 20 expected per decile
    assert [int(t[9:13]) for t in sampling.sample_texts(records, 200 * 14, seed=1)] != picked
    assert [t for t in sampling.sample_texts(records, 10**9, seed=0)] == [r["text"] for r in records]


def error_line(capsys):
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.startswith("error: ")]
    assert len(lines) == 1, err
    return lines[0]


def test_one_direct_worker_runs_in_this_process_and_more_start_worker_processes():
    assert pipelines.beam_options("DirectRunner", 1, []) == ["--runner=DirectRunner", "--direct_running_mode=in_memory"]
    two = pipelines.beam_options("DirectRunner", 2, ["--extra"])
    assert "--direct_running_mode=multi_processing" in two and "--direct_num_workers=2" in two and two[-1] == "--extra"


def test_bad_input_is_one_line_naming_the_file(tmp_path, tok_path, capsys):
    # An empty corpus (found in a worker, reported by the driver).
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.jsonl").write_text('{"text": "  "}\n\n')
    assert run_prepare(tmp_path / "empty", tmp_path / "out_empty", "--tokenizer", str(tok_path), workers=1,
                       shards=1) == 1
    assert error_line(capsys) == f"error: corpus {tmp_path}/empty/a.jsonl is empty"

    # A tokenizer other than the one the output was prepared with.
    write_corpus(tmp_path / "corpus", n_files=5, paragraphs=PARAGRAPHS)
    out = tmp_path / "out"
    other = tmp_path / "other.json"
    tok_lib.train([SHAKESPEARE[300_000:400_000]], 300).save(str(other))
    assert run_prepare(tmp_path / "corpus", out, "--tokenizer", str(tok_path)) == 0
    capsys.readouterr()
    assert run_prepare(tmp_path / "corpus", out, "--tokenizer", str(other)) == 1
    line = error_line(capsys)
    assert line.startswith(f"error: --tokenizer {other} (hash ")
    assert f"is not the tokenizer {out}/tokenizer.json" in line

    # Training on it with another tokenizer is refused by the loader, naming the manifest.
    cfg = config_lib.DataConfig(source="prepared", path=str(out), tokenizer=str(other))
    with pytest.raises(DataError, match=rf"token dataset {out} was tokenized by tokenizer \w+ \(its manifest.json\) "
                                        rf"but tokenizer {other} is \w+") as info:
        pipeline.tokenized_corpus(cfg, vocab_size=300, seq_len=8, cache_dir=tmp_path / "cache")
    assert "\n" not in str(info.value)

    # An unreadable (truncated) shard.
    shard = out / token_shards.shard_file(1, 3)
    size = shard.stat().st_size
    os.truncate(shard, 10)
    with pytest.raises(DataError, match=rf"token shard {shard} has 10 bytes, not {size:,}: prepare the dataset again"):
        pipeline.tokenized_corpus(config_lib.DataConfig(source="prepared", path=str(out)), vocab_size=300, seq_len=8,
                         cache_dir=tmp_path / "cache")


def test_published_corpus_files_json_gz_and_parquet(tmp_path):
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = PARAGRAPHS[:30]
    with gzip.open(tmp_path / "c4-train.00000-of-01024.json.gz", "wt") as f:
        f.writelines(json.dumps({"text": d, "url": "u", "timestamp": "t"}) + "\n" for d in docs[:20])
    # a blank and a missing text are no documents
    pq.write_table(pa.table({"text": docs[20:] + [" \n", None], "id": list(range(12))}), tmp_path / "000_00000.parquet")
    files = corpus_units._hf_files(str(tmp_path))
    assert [p.name for p in files] == ["000_00000.parquet", "c4-train.00000-of-01024.json.gz"]
    assert [d for p in files for d in corpus_units.unit_documents(("hf-jsonl", str(p)))] == docs[20:] + docs[:20]

    (tmp_path / "cut.json.gz").write_bytes(gzip.compress(b'{"text": "a"}\n' * 100)[:40])
    with pytest.raises(DataError, match=rf"{tmp_path}/cut.json.gz: unreadable \(EOFError"):
        list(corpus_units.unit_documents(("hf-jsonl", str(tmp_path / "cut.json.gz"))))
    pq.write_table(pa.table({"content": ["x"]}), tmp_path / "other.parquet")
    with pytest.raises(DataError, match=rf"^{tmp_path}/other.parquet: no 'text' column \(it has: content\)$"):
        list(corpus_units.unit_documents(("hf-jsonl", str(tmp_path / "other.parquet"))))


def test_units_are_cut_into_contiguous_shards_of_about_equal_size():
    assert corpus_units.assign_shards([10] * 6, 3) == [[0, 1], [2, 3], [4, 5]]
    assert corpus_units.assign_shards([1, 1, 1, 100], 2) == [[0, 1, 2], [3]]
    assert corpus_units.assign_shards([100, 1, 1, 1], 2) == [[0], [1, 2, 3]]
    assert corpus_units.assign_shards([10, 10], 3) == [[0], [], [1]]   # fewer units than shards: one stays empty


class AndreaPrepareDocs(tfds.core.GeneratorBasedBuilder):
    """A registered TFDS text dataset in array_record format, standing in for c4/en or lm1b."""

    VERSION = tfds.core.Version("1.0.0")

    @tfds.core.utils.classproperty
    @classmethod
    def url_infos(cls):  # nothing to download (see andrea_jax/data/tfds_builder.py)
        return None

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, disable_shuffling=True,
                                     features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i, text in enumerate(PARAGRAPHS[:TRAINED_DOCS]):
            yield i, {"text": text}


TRAINED_DOCS = 300  # paragraphs of the corpus that goes through preparation and training


def published_corpus(folder):
    """The paragraphs as a corpus is published: a .json.gz of C4's fields and a parquet file.
    Returns (--path, the documents in corpus order: the files' sorted names)."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    docs = PARAGRAPHS[:TRAINED_DOCS]
    with gzip.open(folder / "c4-train.00000-of-00002.json.gz", "wt") as f:
        f.writelines(json.dumps({"text": d, "url": "u", "timestamp": "t"}) + "\n" for d in docs[:200])
    pq.write_table(pa.table({"text": docs[200:]}), folder / "c4-train.00001-of-00002.parquet")
    return ["--path", str(folder)], docs


def tfds_corpus(folder):
    AndreaPrepareDocs(data_dir=str(folder), file_format="array_record").download_and_prepare()
    return ["--name", "andrea_prepare_docs", "--data-dir", str(folder)], PARAGRAPHS[:TRAINED_DOCS]


@pytest.mark.parametrize("source", ["hf-jsonl", "tfds"])
def test_a_prepared_corpus_trains_with_data_source_prepared(source, tmp_path, tok_path, capsys):
    """prepare --source hf-jsonl | tfds, then a training run on `data.source=prepared`: the
    run reads the prepared tokens (the corpus's documents encoded in order), with their tokenizer."""
    where, docs = (published_corpus if source == "hf-jsonl" else tfds_corpus)(tmp_path / "corpus")
    out = tmp_path / "prepared"
    argv = ["--source", source, *where, "--out", str(out), "--tokenizer", str(tok_path), "--workers", "1",
            "--shards", "2"]
    assert prepare.main(argv) == 0, capsys.readouterr().err
    tok = tok_lib.load(tok_path)
    want = np.concatenate([tok_lib.encode(tok, d) + [tok_lib.eot_id(tok)] for d in docs])
    np.testing.assert_array_equal(np.asarray(token_shards.ShardedTokens.open(out)), want)
    capsys.readouterr()

    run = tmp_path / "run"
    sets = ["data.source=prepared", f"data.path={out}", "model.vocab_size=300", "model.seq_len=16",
            "model.d_model=32", "model.n_layer=2", "model.n_head=2", "train.batch_size=4", "train.steps=2",
            "train.log_every=1", "train.eval_every=2", "train.eval_batches=1", "train.sample_tokens=0",
            "train.checkpoint_every=0", "diagnostics.tensorboard=false"]
    assert train_cli.main(["--config", "tiny", "--workdir", str(run), *[a for s in sets for a in ("--set", s)]]) == 0, \
        capsys.readouterr().err
    n_train = len(want) - int(len(want) * config_lib.DataConfig().val_fraction)  # the rest is validation
    assert f" parameters, {n_train:,} training tokens, " in capsys.readouterr().out
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert all(np.isfinite(line["loss"]) for line in lines) and np.isfinite(lines[-1]["val_loss"])
    assert (tok_lib.load(run / "tokenizer.json").to_str() == tok_lib.load(out / "tokenizer.json").to_str()
            == tok.to_str())
