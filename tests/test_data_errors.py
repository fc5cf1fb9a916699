"""Bad input stops the run with one clear line naming the file; invalid UTF-8 is repaired and counted."""
import re

import numpy as np
import pytest
import tensorflow_datasets as tfds

import train as train_cli
from andrea_jax import config as config_lib, configs
from andrea_jax.data import documents, pipeline, tokenizer as tok_lib
from andrea_jax.errors import DataError, DataWarning

SHAKESPEARE = pipeline.read_text(pipeline.EMBEDDED_CORPUS)


def prepare(tmp_path, tok_path, path, seq_len=8, **kw):
    cfg = config_lib.DataConfig(source="files", path=str(path), tokenizer=str(tok_path), **kw)
    return pipeline.tokenized_corpus(cfg, vocab_size=300, seq_len=seq_len, cache_dir=tmp_path / "cache")


def fails(tmp_path, tok_path, path, message, **kw):
    with pytest.raises(DataError) as info:
        prepare(tmp_path, tok_path, path, **kw)
    text = str(info.value)
    assert "\n" not in text
    assert re.search(message, text), text
    return text


def test_missing_path(tmp_path, tok_path):
    fails(tmp_path, tok_path, tmp_path / "nowhere", rf"data.path '{tmp_path}/nowhere': no such file or folder")
    fails(tmp_path, tok_path, tmp_path / "*.jsonl", rf"data.path '{tmp_path}/\*.jsonl' matches no files")
    (tmp_path / "empty_folder").mkdir()
    fails(tmp_path, tok_path, tmp_path / "empty_folder",
          rf"folder {tmp_path}/empty_folder holds no .txt or .jsonl files")
    (tmp_path / "data.csv").write_text("a,b\n")
    fails(tmp_path, tok_path, tmp_path / "data.csv", rf"{tmp_path}/data.csv: not a .txt or .jsonl file")


def test_prepare_names_its_own_flag(tmp_path, capsys):
    from andrea_jax.data.prepare import driver

    assert driver.main(["--source", "files", "--path", str(tmp_path / "nowhere"),
                              "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == f"error: --path '{tmp_path}/nowhere': no such file or folder\n"


def test_empty_corpus(tmp_path, tok_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "a.txt").write_text("")
    fails(tmp_path, tok_path, tmp_path / "one", rf"corpus file {tmp_path}/one/a.txt is empty")
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "a.txt").write_text("  \n\n ")
    (tmp_path / "two" / "b.jsonl").write_text('{"text": ""}\n\n')
    fails(tmp_path, tok_path, tmp_path / "two", rf"corpus of 2 files \({tmp_path}/two/a.txt, ...\) is empty")


def test_corpus_shorter_than_one_window(tmp_path, tok_path):
    (tmp_path / "short.txt").write_text("To be, or not to be.")
    fails(tmp_path, tok_path, tmp_path / "short.txt",
          rf"the training part of corpus {tmp_path}/short.txt has \d+ tokens, fewer than one window of "
          r"model.seq_len \+ 1 = 65", seq_len=64)


def test_too_small_for_the_tokenizer_names_the_corpus(tmp_path):
    (tmp_path / "small.txt").write_text("ab ab ab")
    cfg = config_lib.DataConfig(source="files", path=str(tmp_path / "small.txt"))
    with pytest.raises(DataError, match=rf"corpus {tmp_path}/small.txt: the corpus yields only \d+ BPE merges"):
        pipeline.tokenized_corpus(cfg, vocab_size=300, seq_len=8, cache_dir=tmp_path / "cache")


def test_binary_file(tmp_path, tok_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text(SHAKESPEARE[:5000])
    (tmp_path / "corpus" / "model.txt").write_bytes(b"PK\x03\x04" + bytes(range(256)) * 4)
    fails(tmp_path, tok_path, tmp_path / "corpus",
          rf"{tmp_path}/corpus/model.txt is a binary file \(NUL byte at offset 4\)")
    (tmp_path / "lines.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "bad\x00"}\n')
    fails(tmp_path, tok_path, tmp_path / "lines.jsonl",
          rf"{tmp_path}/lines.jsonl is a binary file \(NUL byte at offset 30\)")
    (tmp_path / "zero.txt").write_bytes(b"\0" + SHAKESPEARE[:100].encode())
    fails(tmp_path, tok_path, tmp_path / "zero.txt", rf"{tmp_path}/zero.txt is a binary file \(NUL byte at offset 0\)")


def test_jsonl_line_without_text(tmp_path, tok_path):
    (tmp_path / "a.jsonl").write_text('{"text": "fine"}\n{"title": "no text", "body": "x"}\n')
    fails(tmp_path, tok_path, tmp_path / "a.jsonl",
          rf"{tmp_path}/a.jsonl line 2: the record has no 'text' field \(it has: title, body\)")
    (tmp_path / "b.jsonl").write_text('{"text": "fine"}\n\n{"text": 3}\n')
    fails(tmp_path, tok_path, tmp_path / "b.jsonl", rf"{tmp_path}/b.jsonl line 3: 'text' is a int, not a string")
    (tmp_path / "c.jsonl").write_text('{"text": "fine"}\n{"text": "cut off\n')
    fails(tmp_path, tok_path, tmp_path / "c.jsonl", rf"{tmp_path}/c.jsonl line 2: not valid JSON")
    (tmp_path / "d.jsonl").write_text('{"text": "fine"}\n["text"]\n')
    fails(tmp_path, tok_path, tmp_path / "d.jsonl",
          rf"{tmp_path}/d.jsonl line 2: the record has no 'text' field \(it has: list\)")


def test_invalid_utf8_is_replaced_and_counted_never_a_crash(tmp_path, tok_path):
    (tmp_path / "corpus").mkdir()
    good = SHAKESPEARE[:3000]
    (tmp_path / "corpus" / "a.txt").write_bytes(good.encode() + b" caf\xe9 \xff\xfe end \xef\xbf\xbd")
    (tmp_path / "corpus" / "b.jsonl").write_bytes(b'{"text": "ok \xc3"}\n')
    with pytest.warns(DataWarning) as record:
        corpus = prepare(tmp_path, tok_path, tmp_path / "corpus")
    messages = sorted(str(w.message) for w in record)
    # The genuine U+FFFD (ef bf bd) at the end is text, not an error: 3 replacements in a.txt.
    assert messages == [f"{tmp_path}/corpus/a.txt: 3 invalid UTF-8 sequence(s) replaced by U+FFFD",
                        f"{tmp_path}/corpus/b.jsonl: 1 invalid UTF-8 sequence(s) replaced by U+FFFD"]
    tok = tok_lib.load(tok_path)
    stream = np.concatenate([corpus.train_tokens, corpus.val_tokens])
    assert tok_lib.decode(tok, stream) == (good + " caf\ufffd \ufffd\ufffd end \ufffd<|endoftext|>"
                                           "ok \ufffd<|endoftext|>")


def test_tfds_dataset_not_prepared_says_how_and_where(tmp_path, monkeypatch):
    cfg = config_lib.DataConfig(source="tfds", tfds_name="lm1b", data_dir=str(tmp_path / "tfds"),
                                tfds_download=False)
    with pytest.raises(DataError) as info:
        pipeline.tokenized_corpus(cfg, vocab_size=300, seq_len=8, cache_dir=tmp_path / "cache")
    text = str(info.value)
    assert "\n" not in text
    assert f"TFDS dataset 'lm1b' is not prepared in data_dir {tmp_path}/tfds (looked in {tmp_path}/tfds/lm1b/" in text
    assert "data.tfds_download is off" in text
    assert f"`tfds build lm1b --data_dir {tmp_path}/tfds --file_format array_record`" in text

    # With downloads on and no network (simulated, so that a machine with network downloads nothing).
    def no_network(self, *args, **kwargs):
        raise ConnectionError("Failed to resolve storage.googleapis.com\nmore detail")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", no_network)
    with pytest.raises(DataError, match=r"and downloading it failed \(ConnectionError: Failed to resolve "
                                        r"storage.googleapis.com\): prepare it where there is network"):
        pipeline.tokenized_corpus(
            config_lib.DataConfig(source="tfds", tfds_name="lm1b", data_dir=str(tmp_path / "tfds")),
            vocab_size=300, seq_len=8, cache_dir=tmp_path / "cache")

    with pytest.raises(DataError, match=rf"TFDS dataset 'no_such_dataset_xyz' has no builder here and no "
                                        rf"prepared copy in data_dir {tmp_path}/tfds: prepare it"):
        pipeline.tokenized_corpus(config_lib.DataConfig(source="tfds", tfds_name="no_such_dataset_xyz",
                                               data_dir=str(tmp_path / "tfds")),
                         vocab_size=300, seq_len=8, cache_dir=tmp_path / "cache")


def test_data_error_is_one_line_and_exit_1_from_train_py(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))
    rc = train_cli.main(["--config", "tiny", "--workdir", str(tmp_path / "run"),
                         "--set", "data.source=files", "--set", f"data.path={tmp_path}/missing"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err == f"error: data.path '{tmp_path}/missing': no such file or folder\n"


@pytest.mark.parametrize("sets, message", [
    (["data.source=web"], "data.source: unknown source 'web'; known: embedded, files, tfds, prepared"),
    (["data.source=files"], "data.path: data.source=files needs a folder, file or glob"),
    (["data.source=prepared"],
     "data.path: data.source=prepared needs the folder written by python -m andrea_jax.data.prepare"),
    (["data.tokenizer_sample_mb=0"], "data.tokenizer_sample_mb: must be positive, got 0"),
    (["data.pretokenize=false"], "unknown config key 'data.pretokenize'"),  # the token cache is the one route
    (["data.path=/x"], "data.path: is only read with data.source=files or prepared, not 'embedded'"),
    (["data.source=tfds"], "data.tfds_name: data.source=tfds needs a TFDS dataset name"),
    (["data.tfds_val_split=test"], "data.tfds_val_split: is only read with data.source=tfds"),
    (["data.source=tfds", "data.tfds_name=lm1b", "data.tfds_split="], "data.tfds_split: must name the split"),
])
def test_config_checks_name_the_data_key(sets, message):
    with pytest.raises(config_lib.ConfigError, match=re.escape(message)):
        config_lib.validate(config_lib.override(configs.load("tiny"), sets))


def test_the_files_of_a_relative_path_are_named_absolutely(tmp_path, monkeypatch):
    (tmp_path / "corpus" / "part").mkdir(parents=True)
    (tmp_path / "corpus" / "part" / "b.txt").write_text("b")
    (tmp_path / "corpus" / "a.jsonl").write_text('{"text": "a"}\n')
    monkeypatch.chdir(tmp_path)
    expected = [tmp_path / "corpus" / "a.jsonl", tmp_path / "corpus" / "part" / "b.txt"]
    assert documents.find_files("corpus") == expected
    assert documents.find_files("corpus/**/*.txt") == expected[1:]
    assert documents.find_files("corpus/a.jsonl") == expected[:1]


def test_read_text_refuses_a_missing_or_blank_file(tmp_path):
    with pytest.raises(DataError, match=rf"^corpus file {tmp_path}/nowhere.txt does not exist$"):
        pipeline.read_text(tmp_path / "nowhere.txt")
    (tmp_path / "blank.txt").write_text(" \n\t\n")
    with pytest.raises(DataError, match=rf"^corpus file {tmp_path}/blank.txt is empty$"):
        pipeline.read_text(tmp_path / "blank.txt")
    (tmp_path / "bad.txt").write_bytes(b"ok \xff")
    assert pipeline.read_text(tmp_path / "bad.txt") == "ok \ufffd"


def test_a_missing_tokenizer_or_one_of_another_size_is_one_line(tmp_path, tok_path):
    (tmp_path / "a.txt").write_text(SHAKESPEARE[:20_000])
    fails(tmp_path, tmp_path / "none.json", tmp_path / "a.txt", rf"^data.tokenizer {tmp_path}/none.json: no such file$")
    cfg = config_lib.DataConfig(source="files", path=str(tmp_path / "a.txt"), tokenizer=str(tok_path))
    with pytest.raises(DataError, match=r"^tokenizer has 300 tokens but model.vocab_size is 301$"):
        pipeline.tokenized_corpus(cfg, vocab_size=301, seq_len=8, cache_dir=tmp_path / "cache")


def test_each_part_needs_one_whole_window(tmp_path, tok_path):
    (tmp_path / "a.txt").write_text(SHAKESPEARE[:20_000])
    n_val = len(prepare(tmp_path, tok_path, tmp_path / "a.txt").val_tokens)
    assert len(prepare(tmp_path, tok_path, tmp_path / "a.txt", seq_len=n_val - 1).val_tokens) == n_val
    fails(tmp_path, tok_path, tmp_path / "a.txt", rf"^the validation part \(data.val_fraction=0.05\) of corpus .* has "
          rf"{n_val} tokens, fewer than one window of model.seq_len \+ 1 = {n_val + 1}$", seq_len=n_val)
