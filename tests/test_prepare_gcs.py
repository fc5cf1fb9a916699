"""Object stores end to end, against a GCS emulator (`gcp-storage-emulator`, the `test` extra) started
here on 127.0.0.1: `prepare --path gs://... --out gs://...` writes the same shards, indexes, TFDS
metadata and tokenizer as from and to a local folder; a rerun finds it complete; a training run
on `data.source=prepared data.path=gs://...` has the losses of the same run on the local folder;
s3:// is refused in one line."""
import contextlib
import json
import pathlib
import subprocess
import sys
import time
import urllib.request

import gcsfs  # noqa: F401  a test dependency (the `test` extra): never skipped
import numpy as np
import portpicker
import pytest
from etils import epath

import train as train_cli
from andrea_jax.data import bucket_cache, pipeline, token_shards
from andrea_jax.data.prepare import driver as prepare
from andrea_jax.errors import DataError
from _corpus import PARAGRAPHS, write_corpus

BUCKET = "andrea-test"


@contextlib.contextmanager
def gcs_emulator(log: pathlib.Path):
    """http://127.0.0.1:PORT of an in-memory GCS emulator holding an empty bucket BUCKET, stopped at exit."""
    port = portpicker.pick_unused_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
                                 "--port", str(port), "--in-memory", "--default-bucket", BUCKET],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/storage/v1/b/{BUCKET}", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the GCS emulator did not start:\n{log.read_text()[-2000:]}") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def emulator(tmp_path, monkeypatch):
    """The emulator's URL, in STORAGE_EMULATOR_HOST of this process and of the ones it starts
    (the pipeline's workers): gcsfs, under etils.epath, sends every request there. (Not with
    FSSPEC_GCS_TOKEN=anon: gcsfs then asks the emulator for the bucket's layout over gRPC, which
    it does not serve, and retries for minutes.)"""
    import fsspec
    from etils.epath import backend

    with gcs_emulator(tmp_path / "emulator.log") as url:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
        backend.fsspec_backend._get_filesystem.cache_clear()   # a gcsfs made before knew no emulator
        fsspec.get_filesystem_class("gcs").clear_instance_cache()
        yield url
        backend.fsspec_backend._get_filesystem.cache_clear()
        fsspec.get_filesystem_class("gcs").clear_instance_cache()


def train_losses(data_path, workdir, capsys) -> list[float]:
    sets = ["data.source=prepared", f"data.path={data_path}", "model.vocab_size=300", "model.seq_len=16",
            "model.d_model=32", "model.n_layer=2", "model.n_head=2", "train.batch_size=4", "train.steps=3",
            "train.log_every=1", "train.eval_every=3", "train.eval_batches=1", "train.sample_tokens=0",
            "train.checkpoint_every=0", "diagnostics.tensorboard=false"]
    argv = ["--config", "tiny", "--workdir", str(workdir), *[a for s in sets for a in ("--set", s)]]
    assert train_cli.main(argv) == 0, capsys.readouterr().err
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    return [line["loss"] for line in lines] + [lines[-1]["val_loss"]]


def without_timing(marker: dict) -> dict:
    return {k: v for k, v in marker.items() if k not in ("made", "source_key")}


def test_prepare_to_and_train_from_a_bucket_equal_a_local_folder(tmp_path, emulator, capsys, monkeypatch):
    corpus = tmp_path / "corpus"
    names = sorted(p.name for p in write_corpus(corpus, n_files=3).iterdir())
    for name in names:   # the same corpus in the bucket: --path gs://
        epath.Path(f"gs://{BUCKET}/corpus/{name}").write_bytes((corpus / name).read_bytes())
    local, remote = tmp_path / "prepared", epath.Path(f"gs://{BUCKET}/runs/prepared")
    common = ["--source", "files", "--vocab-size", "300", "--workers", "1", "--shards", "2"]
    assert prepare.main([*common, "--path", str(corpus), "--out", str(local)]) == 0, capsys.readouterr().err
    assert prepare.main([*common, "--path", f"gs://{BUCKET}/corpus", "--out", str(remote)]) == 0, \
        capsys.readouterr().err

    # Every file of the local output is in the bucket, the same bytes (markers and manifest: but
    # their timing and the input's key, which names its paths).
    local_files = sorted(p.name for p in local.iterdir())
    assert sorted(p.name for p in remote.iterdir()) == local_files
    for name in local_files:
        mine, theirs = (local / name).read_bytes(), (remote / name).read_bytes()
        if name.endswith(".json") and name not in ("tokenizer.json", "features.json", "dataset_info.json"):
            mine, theirs = without_timing(json.loads(mine)), without_timing(json.loads(theirs))
            mine.pop("source", None), theirs.pop("source", None)
        if name == "dataset_info.json":   # its description names the input
            mine, theirs = (json.loads(x) for x in (mine, theirs))
            mine.pop("description"), theirs.pop("description")
        assert mine == theirs, name
    assert len(token_shards.ShardedTokens.open(remote)) == len(token_shards.ShardedTokens.open(local))

    # A rerun on the complete bucket output finds it so.
    assert prepare.main([*common, "--path", f"gs://{BUCKET}/corpus", "--out", str(remote)]) == 0
    assert "nothing to do" in capsys.readouterr().out

    cache = tmp_path / "cache"
    monkeypatch.setenv("ANDREA_CACHE", str(cache))
    from_bucket = train_losses(str(remote), tmp_path / "run_gs", capsys)
    assert f"copying 2 shard(s) of {remote}" in capsys.readouterr().out
    from_folder = train_losses(str(local), tmp_path / "run_local", capsys)
    print(f"losses gs:// {from_bucket} local {from_folder}", file=sys.__stdout__)
    # exact by construction: the same compiled steps on the same tokens (the bucket's are a copy)
    assert from_bucket == from_folder and all(np.isfinite(from_bucket))
    # Its local copy is made once: a second run reads it.
    copies = list((cache / "prepared").iterdir())
    assert len(copies) == 1 and bucket_cache.local_copy(remote, cache) == copies[0]
    assert "copying" not in capsys.readouterr().out


def test_a_dataset_prepared_again_in_the_same_bucket_folder_is_copied_afresh(tmp_path, emulator, capsys,
                                                                           monkeypatch):
    remote = epath.Path(f"gs://{BUCKET}/runs/prepared")
    common = ["--source", "files", "--vocab-size", "300", "--workers", "1"]
    first = write_corpus(tmp_path / "first", n_files=2, paragraphs=PARAGRAPHS[: len(PARAGRAPHS) // 2])
    second = write_corpus(tmp_path / "second", n_files=3, paragraphs=PARAGRAPHS[len(PARAGRAPHS) // 2:])
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))
    assert prepare.main([*common, "--shards", "2", "--path", str(first), "--out", str(remote)]) == 0
    capsys.readouterr()
    before = train_losses(str(remote), tmp_path / "run_first", capsys)
    assert f"copying 2 shard(s) of {remote}" in capsys.readouterr().out

    # The same URL, prepared again from another corpus: the local copy of the first must not be read.
    remote.rmtree()
    assert prepare.main([*common, "--shards", "3", "--path", str(second), "--out", str(remote)]) == 0
    assert prepare.main([*common, "--shards", "3", "--path", str(second), "--out", str(tmp_path / "local")]) == 0
    capsys.readouterr()
    after = train_losses(str(remote), tmp_path / "run_second", capsys)
    assert f"copying 3 shard(s) of {remote}" in capsys.readouterr().out
    # exact by construction: the same compiled steps on the same tokens, a copy of the new ones
    assert after == train_losses(str(tmp_path / "local"), tmp_path / "run_local", capsys)
    assert after != before


def test_s3_is_refused_in_one_line(tmp_path, capsys):
    assert prepare.main(["--source", "files", "--path", str(tmp_path), "--out", "s3://bucket/x"]) == 1
    err = capsys.readouterr().err
    assert err == "error: --out s3://bucket/x: s3:// is not supported, only local paths and gs://BUCKET/PATH\n"
    cfg = type("D", (), {"path": "s3://bucket/x", "tokenizer": ""})()
    with pytest.raises(DataError, match=r"^data.path s3://bucket/x: s3:// is not supported"):
        pipeline._open_prepared(cfg, 300, tmp_path)
