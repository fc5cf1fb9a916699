"""Prepare a corpus once, at any size: documents -> tokenizer -> K shards of token ids, as one
Apache Beam pipeline (the `beam` extra). On one machine it runs on Beam's DirectRunner with N
worker processes; the same pipeline runs on a Flink, Spark or Dataflow cluster.

    python -m andrea_jax.data.prepare --source files --path corpus/ --out data/mine --workers 2 --shards 8
    python -m andrea_jax.data.prepare --source hf-jsonl --path 'c4/en/c4-train.*.json.gz' --out data/c4
    python -m andrea_jax.data.prepare --source tfds --name lm1b --data-dir /data/tfds --out data/lm1b

The input is cut into units (a file; a range of TFDS records) and the units, in corpus order, into K
shards of about equal size. Each shard is tokenized by one worker, in document order, with
`<|endoftext|>` after every document, so the shards concatenated are exactly the token stream the
single-process path makes (tokenize.py, the same `encode_batch`). The output is the token
format of token_shards.py, a TFDS dataset in array_record format (one record per document, K
shards, `tfds.builder_from_directory(OUT)` reads it) with an index of token offsets; a training
run reads it with `data.source=prepared data.path=OUT`.

Without --tokenizer, the BPE is trained inside the same pipeline on a seeded uniform sample of
documents from the whole corpus (sampling.py: the --tokenizer-docs documents of smallest key, by
Beam's Top.Smallest) and saved as OUT/tokenizer.json. Its hash is in every shard's marker, in the
manifest and is the TFDS config name: a shard or a dataset made by another tokenizer is never
reused or read.

Idempotent: each shard's marker is written after its files, the manifest after all markers, each by
an atomic rename. A rerun on a complete output does nothing; after an interruption it redoes only
the shards without a valid marker.
"""
from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import pathlib
import re
import sys
import time
from typing import Iterator, Sequence

import numpy as np

from andrea_jax.data import documents, shard_writer, tokenize, sampling, token_shards, tokenizer as tokenizer_lib
from andrea_jax.errors import DataError

SOURCES = ("files", "hf-jsonl", "tfds")
RUNNERS = {"direct": "DirectRunner", "flink": "FlinkRunner", "spark": "SparkRunner", "dataflow": "DataflowRunner"}
HF_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")
TOKENIZER = "tokenizer.json"


# ---------------------------------------------------------------------------------------------
# The input: units of documents, in corpus order.

def _hf_files(pattern: str) -> list[pathlib.Path]:
    """The sorted JSON-lines (optionally gzipped) and parquet files named by a file, folder or glob."""
    import glob

    path = pathlib.Path(pattern).expanduser()
    if any(c in pattern for c in "*?["):
        files = sorted(pathlib.Path(p) for p in glob.glob(str(path), recursive=True) if os.path.isfile(p))
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(HF_SUFFIXES))
    elif path.is_file():
        files = [path]
    else:
        raise DataError(f"--path {pattern!r}: no such file or folder")
    if not files:
        raise DataError(f"--path {pattern!r} names no {', '.join(HF_SUFFIXES)} files")
    for p in files:
        if not p.name.endswith(HF_SUFFIXES):
            raise DataError(f"{p}: not one of {', '.join(HF_SUFFIXES)}")
    return [p.resolve() for p in files]


def _hf_documents(path: pathlib.Path) -> Iterator[str]:
    """The non-blank `text` fields of a JSON-lines (.gz) or parquet file (C4, FineWeb, ...)."""
    if path.name.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            table = pq.ParquetFile(path)
            if "text" not in table.schema_arrow.names:
                raise DataError(f"{path}: no 'text' column (it has: {', '.join(table.schema_arrow.names)})")
            for batch in table.iter_batches(columns=["text"], batch_size=4096):
                for text in batch.column(0).to_pylist():
                    if text and text.strip():
                        yield text
        except DataError:
            raise
        except Exception as e:  # pyarrow's errors: a truncated or non-parquet file
            raise DataError(f"{path}: unreadable parquet file ({type(e).__name__}: {str(e).splitlines()[0]})") from None
        return
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                line, _ = documents.decode(raw)
                if line.strip():
                    text = documents._jsonl_text(path, lineno, line)
                    if text.strip():
                        yield text
    except (OSError, EOFError) as e:  # gzip: a truncated download or not gzip at all
        raise DataError(f"{path}: unreadable ({type(e).__name__}: {e})") from None


_TFDS_SOURCES: dict = {}


def _tfds_records(name: str, split: str, data_dir: str | None):
    """The split's records: of a registered dataset, or of any prepared one in data_dir (read by its
    dataset_info.json alone, so that workers need not import the code that registered it)."""
    key = (name, split, data_dir)
    if key not in _TFDS_SOURCES:
        from andrea_jax.data import sources

        try:
            _TFDS_SOURCES[key] = sources.open_tfds(name, split, "", data_dir, download=False).train
        except DataError:
            infos = sorted(pathlib.Path(data_dir, name).glob("**/dataset_info.json")) if data_dir else []
            if not infos:
                raise
            import tensorflow_datasets as tfds

            _TFDS_SOURCES[key] = tfds.builder_from_directory(str(infos[-1].parent)).as_data_source(split=split)
    return _TFDS_SOURCES[key]


def unit_documents(unit: tuple) -> Iterator[str]:
    """The documents of one unit, in order: ("files", path), ("hf-jsonl", path), ("tfds", name, split,
    data_dir, lo, hi)."""
    kind = unit[0]
    if kind == "files":
        return documents.read_documents(pathlib.Path(unit[1]))
    if kind == "hf-jsonl":
        return _hf_documents(pathlib.Path(unit[1]))
    _, name, split, data_dir, lo, hi = unit
    records = _tfds_records(name, split, data_dir)
    return tokenize.iter_texts(sampling._Subset(records, range(lo, hi)))


def plan_units(args) -> tuple[list[tuple], list[int], str, str]:
    """(units, their sizes, a key of the input's identity, a name for messages)."""
    if args.source in ("files", "hf-jsonl"):
        if not args.path:
            raise DataError(f"--source {args.source} needs --path (a folder, file or glob)")
        try:
            files = documents.find_files(args.path) if args.source == "files" else _hf_files(args.path)
        except DataError as e:  # find_files speaks of the training config's key
            raise DataError(str(e).replace("data.path", "--path")) from None
        from andrea_jax.data.tfds_builder import files_key

        name = str(files[0]) if len(files) == 1 else f"{args.path} ({len(files)} files)"
        return [(args.source, str(p)) for p in files], [p.stat().st_size for p in files], \
            f"{args.source}-{files_key(files)}", name
    if not args.name:
        raise DataError("--source tfds needs --name (a TFDS dataset prepared in array_record format)")
    n = len(_tfds_records(args.name, args.split, args.data_dir))
    pieces = max(args.shards * 4, 1)
    bounds = [n * i // pieces for i in range(pieces + 1)]
    units = [("tfds", args.name, args.split, args.data_dir, lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]
    return units, [hi - lo for *_, lo, hi in units], f"tfds-{args.name}-{args.split}-{n}".replace("/", "_"), \
        f"tfds {args.name} {args.split}"


def assign_shards(sizes: Sequence[int], k: int) -> list[list[int]]:
    """Units (in order) cut into k contiguous groups of about equal total size: each cut at the unit
    boundary nearest to its share of the total."""
    cum = np.cumsum([0, *sizes], dtype=np.float64)
    cuts = [0]
    for target in cum[-1] * np.arange(1, k) / k:
        j = int(np.searchsorted(cum, target))
        j = j - 1 if j == len(cum) or (j > 0 and target - cum[j - 1] <= cum[j] - target) else j
        cuts.append(max(cuts[-1], j))
    cuts.append(len(sizes))
    return [list(range(cuts[i], cuts[i + 1])) for i in range(k)]


# ---------------------------------------------------------------------------------------------
# The pipeline's steps (module functions: pickled to the workers).

_TOKENIZERS: dict = {}


def _tokenizer_from_json(text: str):
    from tokenizers import Tokenizer

    if text not in _TOKENIZERS:
        _TOKENIZERS.clear()
        _TOKENIZERS[text] = Tokenizer.from_str(text)
    return _TOKENIZERS[text]


def keyed_documents(indexed_unit: tuple, seed: int) -> Iterator[tuple]:
    """(sample key, unit index, document index, text) of every document of a unit. A document's id
    is (file, line) for files, its record index for TFDS: the same whatever the shard count."""
    u, unit = indexed_unit
    for j, text in enumerate(unit_documents(unit)):
        doc = unit[4] + j if unit[0] == "tfds" else sampling.doc_id(u, j)
        yield int(sampling.keys([doc], seed)[0]), u, j, text


def train_tokenizer(sample: list, vocab_size: int, out: str, corpus_name: str) -> str:
    """The BPE trained on the sampled documents (in corpus order), saved as OUT/tokenizer.json."""
    if not sample:
        raise DataError(f"corpus {corpus_name} is empty")
    texts = [text for *_, text in sorted(sample, key=lambda e: (e[1], e[2]))]
    try:
        tok = tokenizer_lib.train(texts, vocab_size)
    except ValueError as e:
        raise DataError(f"corpus {corpus_name}: {e}") from None
    shard_writer.atomic_write_bytes(pathlib.Path(out) / TOKENIZER, tok.to_str().encode())
    return tok.to_str()


def shard_label(plan: dict, tok_hash: str, shard: int) -> dict:
    """What made a shard: a marker that says otherwise is not this run's and the shard is redone."""
    return {"source_key": plan["source_key"], "tokenizer": tok_hash, "shard": shard, "shards": plan["shards"]}


def write_shard(shard: int, tok_json: str, plan: dict) -> dict:
    """Tokenizes shard `shard`'s units into its files, unless a valid marker says it is done."""
    tok = _tokenizer_from_json(tok_json)
    tok_hash = tokenize.tokenizer_hash(tok)
    out, count = pathlib.Path(plan["out"]), plan["shards"]
    name = token_shards.shard_file(shard, count)
    label = shard_label(plan, tok_hash, shard)
    done = shard_writer.complete_shard(out, name, label)
    if done is not None:
        return done
    units = [plan["units"][u] for u in plan["assignment"][shard]]
    texts = (text for unit in units for text in unit_documents(unit))
    return shard_writer.write_shard(out, name, tokenize.encode_stream(tok, texts),
                                    tokenize.token_dtype(tok.get_vocab_size()), label)


def write_manifest(markers: list, plan: dict, tok_json: str) -> dict:
    tok = _tokenizer_from_json(tok_json)
    if sum(m["documents"] for m in markers) == 0:
        raise DataError(f"corpus {plan['name']} is empty")
    return shard_writer.write_manifest(
        plan["out"], markers, source=plan["name"], source_key=plan["source_key"],
        tokenizer=tokenize.tokenizer_hash(tok), vocab_size=tok.get_vocab_size())


# ---------------------------------------------------------------------------------------------
# The driver.

def beam_options(runner: str, workers: int, extra: Sequence[str]) -> list[str]:
    args = [f"--runner={RUNNERS[runner]}"]
    if runner == "direct":
        args += ["--direct_running_mode=multi_processing",
                 f"--direct_num_workers={workers}", "--default_sdk_harness_log_level=WARNING"]
    return args + list(extra)


def _existing_tokenizer(out: pathlib.Path, given: str | None):
    """The tokenizer JSON to use: --tokenizer, or one an earlier run trained into OUT; refuses a
    --tokenizer that differs from the one OUT was prepared with."""
    saved = out / TOKENIZER
    if given:
        if not pathlib.Path(given).is_file():
            raise DataError(f"--tokenizer {given}: no such file")
        text = tokenizer_lib.load(given).to_str()
        if saved.is_file() and saved.read_text() != text:
            raise DataError(f"--tokenizer {given} (hash {tokenize.tokenizer_hash(tokenizer_lib.load(given))}) "
                            f"is not the tokenizer {saved} (hash {tokenize.tokenizer_hash(tokenizer_lib.load(saved))}) "
                            f"that {out} was prepared with: use another --out or delete {out}")
        if not saved.is_file():
            shard_writer.atomic_write_bytes(saved, text.encode())
        return text
    return saved.read_text() if saved.is_file() else None


def run_pipeline(args, beam_extra: Sequence[str] = ()) -> dict:
    """Runs (or skips, when complete) the preparation; returns the manifest."""
    out = pathlib.Path(args.out).expanduser().resolve()
    units, sizes, source_key, name = plan_units(args)
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
                token_shards.ShardedTokens.open(out, expect_tokenizer=tokenize.tokenizer_hash(
                    _tokenizer_from_json(tok_json)), tokenizer_name=f"tokenizer {out / TOKENIZER}")
            except DataError as e:  # a shard lost or damaged since: the pipeline redoes it
                print(f"prepare: {e.args[0].split(':')[0]}; redoing what is missing", flush=True)
            else:
                print(f"prepare: {out} is complete ({manifest['tokens']:,} tokens in {len(manifest['shards'])} "
                      f"shards); nothing to do", flush=True)
                return dict(manifest, skipped=True)
    plan = {"out": str(out), "shards": args.shards, "units": units, "name": name, "source_key": source_key,
            "assignment": assign_shards(sizes, args.shards)}
    done_before = 0
    if tok_json is not None:
        tok_hash = tokenize.tokenizer_hash(_tokenizer_from_json(tok_json))
        done_before = sum(shard_writer.complete_shard(out, token_shards.shard_file(s, args.shards),
                                                      shard_label(plan, tok_hash, s)) is not None
                          for s in range(args.shards))
    for leftover in out.glob("*.tmp*"):  # half-written files of an interrupted run (their shards are redone)
        leftover.unlink(missing_ok=True)
    manifest = _run_pipeline(args, plan, tok_json, beam_extra)
    return dict(manifest, shards_tokenized=args.shards - done_before)


def _run_pipeline(args, plan: dict, tok_json: str | None, beam_extra: Sequence[str]) -> dict:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    with beam.Pipeline(options=PipelineOptions(beam_options(args.runner, args.workers, beam_extra))) as p:
        if tok_json is None:
            tok = (p | "Units" >> beam.Create(list(enumerate(plan["units"])))
                   | "SpreadUnits" >> beam.Reshuffle()
                   | "KeyDocuments" >> beam.FlatMap(keyed_documents, args.seed)
                   | "Sample" >> beam.combiners.Top.Smallest(args.tokenizer_docs, key=lambda e: e[0])
                   | "TrainTokenizer" >> beam.Map(train_tokenizer, args.vocab_size, plan["out"], plan["name"]))
        else:
            tok = p | "Tokenizer" >> beam.Create([tok_json])
        tok_side = beam.pvalue.AsSingleton(tok)
        markers = (p | "Shards" >> beam.Create(list(range(plan["shards"])))
                   | "SpreadShards" >> beam.Reshuffle()
                   | "Tokenize" >> beam.Map(write_shard, tok_side, plan))
        _ = (markers | "All" >> beam.combiners.ToList()
             | "Manifest" >> beam.Map(write_manifest, plan, tok_side))
    return token_shards.read_manifest(plan["out"])  # written by a worker: the driver reads it back


def _data_error_line(e: BaseException) -> str | None:
    """The DataError message inside a worker's failure (Beam wraps it in its own traceback)."""
    text = f"{e}\n{''.join(getattr(e, '__notes__', []))}"
    found = re.findall(r"DataError: ([^\n]+?)(?: \[while running '[^']*'\])?$", text, re.M)
    return found[-1] if found else None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m andrea_jax.data.prepare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", choices=SOURCES, required=True)
    p.add_argument("--path", help="files, hf-jsonl: a folder, file or glob")
    p.add_argument("--name", help="tfds: a registered dataset prepared in array_record format, e.g. c4/en")
    p.add_argument("--split", default="train", help="tfds: the split (default train)")
    p.add_argument("--data-dir", help="tfds: its data_dir")
    p.add_argument("--out", required=True, help="the prepared dataset's folder")
    p.add_argument("--tokenizer", help="a tokenizer.json to use; default: train one on a sample")
    p.add_argument("--vocab-size", type=int, default=8449, help="of a trained tokenizer (default 8449)")
    p.add_argument("--tokenizer-docs", type=int, default=100_000,
                   help="documents in the tokenizer's uniform sample (default 100,000)")
    p.add_argument("--seed", type=int, default=0, help="of the tokenizer's sample")
    p.add_argument("--runner", choices=sorted(RUNNERS), default="direct")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="direct: worker processes")
    p.add_argument("--shards", type=int, default=16, help="K, the number of token shards")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, beam_extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parser().parse_args(ours)
    if args.shards < 1 or args.workers < 1:
        parser().error("--shards and --workers must be at least 1")
    logging.getLogger("apache_beam").setLevel(logging.ERROR)  # its workers relay every warning of theirs
    start = time.perf_counter()
    try:
        manifest = run_pipeline(args, beam_extra)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a worker's DataError comes back inside the runner's own exception
        line = _data_error_line(e)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 1
    if not manifest.get("skipped"):
        seconds = time.perf_counter() - start
        done = manifest["shards_tokenized"]
        size = sum((pathlib.Path(args.out) / s["file"]).stat().st_size for s in manifest["shards"])
        print(f"prepare: {manifest['documents']:,} documents, {manifest['tokens']:,} tokens in "
              f"{len(manifest['shards'])} shards ({size / 2**20:,.1f} MiB) in {args.out}; tokenized "
              f"{done} shard(s) in {seconds:.1f} s ({manifest['tokens'] / seconds / 1e6:.2f} M tokens/s "
              f"overall, {args.workers} worker(s))", flush=True)
        print(json.dumps({"tokens": manifest["tokens"], "seconds": round(seconds, 2), "shards_tokenized": done,
                          "workers": args.workers}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
