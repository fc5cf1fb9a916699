"""Prepare a corpus once, at any size: documents -> tokenizer -> K shards of token ids, as Apache
Beam pipelines (the `beam` extra; pipelines.py). On one machine they run on Beam's DirectRunner
with N worker processes or on a local Dask cluster; the same pipelines run on a Dask cluster
(`--runner dask --scheduler ADDRESS`, the `dask` extra) and on Flink, Spark or Dataflow.

    python -m andrea_jax.data.prepare --source files --path corpus/ --out data/mine --workers 2 --shards 8
    python -m andrea_jax.data.prepare --source hf-jsonl --path 'c4/en/c4-train.*.json.gz' --out data/c4
    python -m andrea_jax.data.prepare --source tfds --name lm1b --data-dir /data/tfds --out data/lm1b
    python -m andrea_jax.data.prepare --source files --path corpus/ --out data/mine \
        --runner dask --scheduler tcp://HOST:8786
    python -m andrea_jax.data.prepare --source hf-jsonl --path 'gs://B/c4/*.json.gz' --out gs://B/prepared/c4

--path and --out may be gs://BUCKET/PATH (the `gcs` extra; storage.py): a shard is written locally
and uploaded, each marker and the manifest is one upload.

The input is cut into units (a file; a range of TFDS records) and the units, in corpus order, into K
shards of about equal size (corpus_units.py). Each shard is tokenized by one worker, in document
order, with `<|endoftext|>` after every document, so the shards concatenated are exactly the token
stream the single-process path makes (token_cache.py, the same `encode_batch`). The output is the token
format of token_shards.py, a TFDS dataset in array_record format (one record per document, K
shards, `tfds.builder_from_directory(OUT)` reads it) with an index of token offsets; a training
run reads it with `data.source=prepared data.path=OUT`.

Without --tokenizer, a first pipeline trains the BPE on a seeded uniform sample of documents from
the whole corpus (sampling.py: the --tokenizer-docs documents of smallest key) and saves it as
OUT/tokenizer.json, which the tokenizing pipeline's workers read. Its hash is in every shard's
marker, in the manifest and is the TFDS config name: a shard or a dataset made by another tokenizer
is never reused or read.

Idempotent: each shard's marker is written after its files, the manifest after all markers, each
whole (an atomic rename; an object's single upload). A rerun on a complete output does nothing;
after an interruption it redoes only the shards without a valid marker.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pathlib
import re
import sys
import tempfile
import time
from typing import Sequence

from andrea_jax import signals
from andrea_jax.data import shard_writer, storage, token_cache, token_shards, tokenizer as tokenizer_lib
from andrea_jax.data.prepare.corpus_units import assign_shards, plan_units
from andrea_jax.errors import DataError, MissingExtraError, is_missing

SOURCES = ("files", "hf-jsonl", "tfds")
RUNNERS = {"direct": "DirectRunner", "dask": "apache_beam.runners.dask.dask_runner.DaskRunner",
           "flink": "FlinkRunner", "spark": "SparkRunner", "dataflow": "DataflowRunner"}
TOKENIZER = "tokenizer.json"


# ---------------------------------------------------------------------------------------------
# The driver.

def _tokenizer_hash(text: str) -> str:
    from tokenizers import Tokenizer

    return token_cache.tokenizer_hash(Tokenizer.from_str(text))


def _tokenizer_vocab_size(text: str) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(text).get_vocab_size()


def _existing_tokenizer(out, given: str | None):
    """The tokenizer JSON to use: --tokenizer, or one an earlier run trained into OUT; refuses a
    --tokenizer that differs from the one OUT was prepared with."""
    saved = out / TOKENIZER
    if given:
        if not pathlib.Path(given).is_file():
            raise DataError(f"--tokenizer {given}: no such file")
        text = tokenizer_lib.load(given).to_str()
        if saved.is_file() and saved.read_text() != text:
            raise DataError(f"--tokenizer {given} (hash {token_cache.tokenizer_hash(tokenizer_lib.load(given))}) "
                            f"is not the tokenizer {saved} (hash {_tokenizer_hash(saved.read_text())}) "
                            f"that {out} was prepared with: use another --out or delete {out}")
        if not saved.is_file():
            shard_writer.atomic_write_bytes(saved, text.encode())
        return text
    return saved.read_text() if saved.is_file() else None


def run_pipeline(args, beam_extra: Sequence[str] = ()) -> dict:
    """Runs (or skips, when complete) the preparation; returns the manifest."""
    # Before anything is read or written. Beam's import warns, on the root logger, that a Google
    # client (apitools) that no preparation uses is absent: that line is dropped.
    logging.disable(logging.WARNING)
    try:
        from andrea_jax.data.prepare import pipelines
    except ImportError as err:
        if not is_missing(err, "apache_beam"):
            raise
        raise MissingExtraError("andrea-prepare", "beam") from None
    finally:
        logging.disable(logging.NOTSET)
    out = storage.path(args.out, "--out")
    out = out if storage.is_remote(out) else out.expanduser().resolve()
    units, sizes, source_key, name = plan_units(args)
    if not storage.is_remote(out):   # a bucket has no folders: its objects make their own
        out.mkdir(parents=True, exist_ok=True)
    tok_json = _existing_tokenizer(out, args.tokenizer)
    manifest_path = out / token_shards.MANIFEST
    if manifest_path.is_file() and not token_shards.is_current(out):
        raise DataError(f"{manifest_path} is not of the current token format {token_shards.FORMAT}: use another "
                        f"--out or delete {out}")
    if manifest_path.is_file():
        manifest = token_shards.read_manifest(out)
        if manifest.get("source_key") != source_key:
            raise DataError(f"{manifest_path} is of another input ({manifest.get('source')}, key "
                            f"{manifest.get('source_key')}; now {source_key}): use another --out or delete {out}")
        if len(manifest["shards"]) != args.shards:
            raise DataError(f"{manifest_path} has {len(manifest['shards'])} shards, not --shards {args.shards}: "
                            f"use another --out or delete {out}")
        if tok_json is not None:
            try:
                token_shards.ShardedTokens.open(out, expect_tokenizer=_tokenizer_hash(tok_json),
                                                tokenizer_name=f"tokenizer {out / TOKENIZER}")
            except DataError as e:  # a shard lost or damaged since: the pipeline redoes it
                print(f"prepare: {e.args[0].split(':')[0]}; redoing what is missing", flush=True)
            else:
                print(f"prepare: {out} is complete ({manifest['tokens']:,} tokens in {len(manifest['shards'])} "
                      f"shards); nothing to do", flush=True)
                return dict(manifest, skipped=True)
    plan = {"out": str(out), "shards": args.shards, "units": units, "name": name, "source_key": source_key,
            "assignment": assign_shards(sizes, args.shards)}
    _remove_half_written(out)
    with _own_temporary_folder(), _scheduler(args) as address:
        options = pipelines.beam_options(RUNNERS[args.runner], args.workers, beam_extra, address)
        if tok_json is None:   # phase 1: the tokenizer, saved where phase 2's workers read it
            pipelines.run(lambda p: pipelines.tokenizer_graph(
                p, plan, args.seed, args.tokenizer_docs, args.vocab_size), options)
            storage.refresh(out)
            if not (out / TOKENIZER).is_file():   # no document: no sample, no tokenizer
                raise DataError(f"corpus {name} is empty")
            tok_json = (out / TOKENIZER).read_text()
        tok_hash = _tokenizer_hash(tok_json)
        vocab_size = _tokenizer_vocab_size(tok_json)
        done_before = sum(shard_writer.complete_shard(out, token_shards.shard_file(s, args.shards),
                                                      pipelines.shard_label(plan, tok_hash, s)) is not None
                          for s in range(args.shards))
        pipelines.run(lambda p: pipelines.shards_graph(p, plan, tok_hash, vocab_size), options)
    storage.refresh(out)
    _remove_half_written(out)
    manifest = token_shards.read_manifest(out)  # written by a worker: the driver reads it back
    return dict(manifest, shards_tokenized=args.shards - done_before)


def _remove_half_written(out) -> None:
    """Deletes the temporary files of workers that died while writing (their shards are, or will
    be, written again): before a run, and after it, for a worker lost mid-run whose shard another
    one redid. A bucket has none: its objects are uploaded whole."""
    if storage.is_remote(out):
        return
    for leftover in out.glob("*.tmp*"):
        leftover.unlink(missing_ok=True)


@contextlib.contextmanager
def _own_temporary_folder():
    """TMPDIR, for this process and the workers it starts, a new folder, removed at exit with all in
    it. Beam's runners (a staging cache, file sinks' scratch, the direct runner's worker files) and a
    local Dask cluster (its workers' scratch space) make folders there and leave them behind."""
    saved_env, saved_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    with tempfile.TemporaryDirectory(prefix="andrea_prepare_") as folder:
        os.environ["TMPDIR"], tempfile.tempdir = folder, folder
        try:
            yield
        finally:
            tempfile.tempdir = saved_tempdir
            if saved_env is None:
                os.environ.pop("TMPDIR")
            else:
                os.environ["TMPDIR"] = saved_env


def _scheduler(args):
    """The Dask scheduler's address for --runner dask (dask_cluster.py); nothing for other runners."""
    if args.runner != "dask":
        return contextlib.nullcontext(None)
    from andrea_jax.data.prepare import dask_cluster

    return dask_cluster.scheduler(args.scheduler, args.workers)


_BEAM_STEP = r" \[while running '[^']*'\]"  # what Beam appends to the message of a step's exception


def _data_error_line(e: BaseException) -> str | None:
    """The DataError message inside a worker's failure (Beam wraps it in its own traceback)."""
    text = f"{e}\n{''.join(getattr(e, '__notes__', []))}"
    found = re.findall(rf"DataError: ([^\n]+?)(?:{_BEAM_STEP})?$", text, re.M)
    return found[-1] if found else None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m andrea_jax.data.prepare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", choices=SOURCES, required=True)
    p.add_argument("--path", help="files, hf-jsonl: a folder, file or glob (local or gs://)")
    p.add_argument("--name", help="tfds: a registered dataset prepared in array_record format, e.g. c4/en")
    p.add_argument("--split", default="train", help="tfds: the split (default train)")
    p.add_argument("--data-dir", help="tfds: its data_dir")
    p.add_argument("--out", required=True, help="the prepared dataset's folder (local or gs://BUCKET/PATH)")
    p.add_argument("--tokenizer", help="a tokenizer.json to use; default: train one on a sample")
    p.add_argument("--vocab-size", type=int, default=8449, help="of a trained tokenizer (default 8449)")
    p.add_argument("--tokenizer-docs", type=int, default=100_000,
                   help="documents in the tokenizer's uniform sample (default 100,000)")
    p.add_argument("--seed", type=int, default=0, help="of the tokenizer's sample")
    p.add_argument("--runner", choices=list(RUNNERS), default="direct",
                   help="direct (default), dask, or a cluster's; options after -- go to Beam")
    p.add_argument("--scheduler", help="dask: a running Dask scheduler's address (tcp://HOST:PORT); "
                                       "default: a local cluster of --workers processes")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="direct, dask without --scheduler: worker processes (direct with 1: in this process)")
    p.add_argument("--shards", type=int, default=16, help="K, the number of token shards")
    return p


@signals.command  # a second SIGINT or SIGTERM stops the process at once, whatever it is doing
def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, beam_extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parser().parse_args(ours)
    if args.shards < 1 or args.workers < 1:
        parser().error("--shards and --workers must be at least 1")
    if args.scheduler and args.runner != "dask":
        parser().error(f"--scheduler is for --runner dask, not {args.runner}")
    logging.getLogger("apache_beam").setLevel(logging.ERROR)  # its workers relay every warning of theirs
    start = time.perf_counter()
    try:
        manifest = run_pipeline(args, beam_extra)
    except (DataError, MissingExtraError) as e:  # raised here, or by a step of Beam's in this process
        print(f"error: {re.sub(_BEAM_STEP + '$', '', str(e))}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # a worker's DataError comes back inside the runner's own exception
        line = _data_error_line(e)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 1
    if not manifest.get("skipped"):
        seconds = time.perf_counter() - start
        done = manifest["shards_tokenized"]
        size = sum(s["bytes"] for s in manifest["shards"])
        print(f"prepare: {manifest['documents']:,} documents, {manifest['tokens']:,} tokens in "
              f"{len(manifest['shards'])} shards ({size / 2**20:,.1f} MiB) in {args.out}; tokenized "
              f"{done} shard(s) in {seconds:.1f} s ({manifest['tokens'] / seconds / 1e6:.2f} M tokens/s "
              f"overall, {args.workers} worker(s))", flush=True)
        print(json.dumps({"tokens": manifest["tokens"], "seconds": round(seconds, 2), "shards_tokenized": done,
                          "workers": args.workers}), flush=True)
    return 0

