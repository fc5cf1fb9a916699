"""Data throughput: the loader on pretokenized data, pretokenization, and the Beam preparation.

1. Loader: tokens/s out of the grain iterator of one process, at ANDREA-120M's shapes (seq_len
   1024, windows of 1025 tokens), through the same `loader.train_dataset` / `train_iterator` the
   trainer uses, on a token dataset (token_shards.ShardedTokens: a TFDS array_record dataset, one
   record per document; window -> (shard, record, offset), one array_record read per shard and
   batch) of one shard (the pretokenize cache) and of --shards shards (a prepared dataset), its
   documents of random lengths averaging --doc-tokens tokens (C4's are about 500). Best of
   --repeats runs of --batches batches after a warm-up; the OS page cache holds the files, as for
   data read every epoch.
2. Pretokenization: HF tokenizers batch encoding over documents (the embedded corpus cut into
   paragraphs) with its 8449-token BPE.
3. With --prepare: `python -m andrea_jax.data.prepare` (Beam DirectRunner, multi-processing) on a
   synthetic corpus of --prepare-mb MB of .jsonl files (the embedded corpus's paragraphs, repeated; a
   file of under half the corpus holds its first paragraphs), with 1 and then 2 workers, each worker
   one core (RAYON_NUM_THREADS=1). Reports wall time, the tokens/s per busy worker (tokens over the
   summed tokenizing seconds of the shards), the tokens per CPU-second of the workers (the rate of a
   worker with a core to itself), and how many worker processes tokenized shards and how many shards
   were tokenized at the same time. With --prepare-runner dask: the same on a local Dask cluster of 1
   and 2 worker processes.

    python benchmarks/data.py                      # loader + pretokenization, synthetic 64M tokens
    python benchmarks/data.py --doc-tokens 50      # short documents: many records per window
    python benchmarks/data.py --tokens DIR         # a prepared token dataset (andrea-prepare --out DIR)
    python benchmarks/data.py --prepare            # + the Beam preparation, 1 and 2 workers
    python benchmarks/data.py --only-prepare --prepare-runner dask   # the preparation on Dask
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pathlib
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from andrea_jax.data import loader, pipeline, shard_writer, token_cache, token_shards, tokenizer  # noqa: E402

SEQ_LEN = 1024
# (global batch, process count): the per-process batch is their quotient.
SHAPES = [(64, 1), (512, 1), (512, 8)]


def measure(tokens, global_batch: int, process_count: int, batches: int, repeats: int, threads: int) -> float:
    best = 0.0
    for r in range(repeats):
        it = loader.train_iterator(loader.train_dataset(
            tokens, seq_len=SEQ_LEN, global_batch=global_batch, seed=r, process_index=process_count - 1,
            process_count=process_count), num_threads=threads)
        for _ in range(3):
            next(it)
        start = time.perf_counter()
        n = 0
        for _ in range(batches):
            n += next(it).size
        best = max(best, n / (time.perf_counter() - start))
    return best


def synthetic_dataset(folder: pathlib.Path, n_tokens: int, shards: int, doc_tokens: int) -> token_shards.ShardedTokens:
    """Random ids in documents of geometric lengths of mean doc_tokens, cut into `shards` shards."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 8449, n_tokens, dtype=np.uint16)
    bounds = [n_tokens * s // shards for s in range(shards + 1)]
    markers = []
    for s, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        ends = np.cumsum(rng.geometric(1 / doc_tokens, 2 * (hi - lo) // doc_tokens + 10))
        lengths = np.diff(np.concatenate([[0], ends[ends < hi - lo], [hi - lo]]))
        markers.append(shard_writer.write_shard(folder, token_shards.shard_file(s, shards), [(ids[lo:hi], lengths)],
                                                np.uint16, {"tokenizer": "synthetic"}))
    shard_writer.write_manifest(folder, markers, tokenizer="synthetic")
    return token_shards.ShardedTokens.open(folder)


def measure_pretokenize(tok, copies: int) -> tuple[float, float]:
    docs = pipeline.read_text(pipeline.EMBEDDED_CORPUS).split("\n\n") * copies
    start = time.perf_counter()
    ids = token_cache.encode_documents(tok, docs)
    seconds = time.perf_counter() - start
    return sum(len(d.encode()) for d in docs) / seconds, len(ids) / seconds


def measure_prepare(tok_path: pathlib.Path, folder: pathlib.Path, megabytes: int, workers: int, shards: int,
                    runner: str = "direct") -> dict:
    from andrea_jax.data.prepare import driver as prepare

    corpus = folder / "corpus"
    if not corpus.is_dir():
        corpus.mkdir(parents=True)
        paragraphs = [p for p in pipeline.read_text(pipeline.EMBEDDED_CORPUS).split("\n\n") if p.strip()]
        lines = [json.dumps({"text": p}) + "\n" for p in paragraphs]
        text = "".join(lines)
        file_bytes = megabytes * 2**20 / (2 * shards)
        copies = max(1, round(file_bytes / len(text.encode())))
        if file_bytes < len(text.encode()) / 2:  # a toy size: each file the corpus's first paragraphs, not a copy
            ends = np.cumsum([len(line.encode()) for line in lines])
            text = "".join(lines[:max(1, int(np.searchsorted(ends, file_bytes)))])
        for f in range(2 * shards):
            (corpus / f"part{f:03d}.jsonl").write_text(text * copies)
    out = folder / f"out_{runner}{workers}"
    argv = ["--source", "hf-jsonl", "--path", str(corpus), "--out", str(out), "--tokenizer", str(tok_path),
            "--workers", str(workers), "--shards", str(shards), "--runner", runner]
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        assert prepare.main(argv) == 0
    wall = time.perf_counter() - start
    manifest = token_shards.read_manifest(out)
    made = [json.loads(p.read_text())["made"] for p in out.glob("*.done.json")]
    busy = sum(m["seconds"] for m in made)
    cpu = sum(m["cpu_seconds"] for m in made)
    # How many shards were being tokenized at once, at most: the workers really ran side by side.
    events = sorted([(m["started"], 1) for m in made] + [(m["finished"], -1) for m in made])
    concurrent = max(np.cumsum([e for _, e in events]))
    text_mb = sum(p.stat().st_size for p in corpus.iterdir()) / 2**20
    disk_mb = sum(p.stat().st_size for p in out.iterdir()) / 2**20
    return {"runner": runner, "workers": workers, "shards": shards, "text_mb": text_mb, "tokens": manifest["tokens"],
            "wall_s": wall, "tokens_per_s": manifest["tokens"] / wall,
            "tokens_per_s_per_worker": manifest["tokens"] / busy, "tokens_per_cpu_s": manifest["tokens"] / cpu,
            "worker_pids": len({m["pid"] for m in made}), "max_concurrent_shards": int(concurrent), "disk_mb": disk_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", help="a prepared token dataset folder; default: a synthetic one")
    parser.add_argument("--n-tokens", type=int, default=64 << 20, help="size of the synthetic dataset")
    parser.add_argument("--shards", type=int, default=16, help="shards of the synthetic sharded dataset")
    parser.add_argument("--doc-tokens", type=int, default=500, help="mean document length of the synthetic dataset")
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="grain ReadOptions.num_threads")
    parser.add_argument("--encode-copies", type=int, default=4, help="copies of the corpus to pretokenize")
    parser.add_argument("--prepare", action="store_true", help="also time the Beam preparation, 1 and 2 workers")
    parser.add_argument("--prepare-mb", type=int, default=32, help="MB of text the preparation reads")
    parser.add_argument("--prepare-shards", type=int, default=8)
    parser.add_argument("--prepare-runner", choices=("direct", "dask"), default="direct",
                        help="the preparation's runner: direct, or a local Dask cluster of 1 and 2 workers")
    parser.add_argument("--only-prepare", action="store_true", help="skip the loader and pretokenization")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        if args.only_prepare:
            datasets = {}
        elif args.tokens:
            datasets = {f"{args.tokens}": token_shards.ShardedTokens.open(args.tokens)}
        else:
            datasets = {}
            for name, folder, shards in (("1 shard", "one", 1), (f"{args.shards} shards", "many", args.shards)):
                start = time.perf_counter()
                datasets[name] = synthetic_dataset(tmp / folder, args.n_tokens, shards, args.doc_tokens)
                size = sum((tmp / folder / f).stat().st_size for f in datasets[name].files)
                print(f"wrote {args.n_tokens:,} tokens in {int(datasets[name].documents.sum()):,} documents "
                      f"(records) into {shards} array_record shard(s) in {time.perf_counter() - start:.1f} s: "
                      f"{size / 2 / args.n_tokens:.3f} x the raw uint16 size")
        for name, tokens in datasets.items():
            print(f"{len(tokens):,} tokens ({name}, {int(tokens.documents.sum()):,} documents), seq_len {SEQ_LEN}, "
                  f"{args.threads} grain threads")
            for global_batch, processes in SHAPES:
                local = global_batch // processes
                rate = measure(tokens, global_batch, processes, args.batches, args.repeats, args.threads)
                print(f"  per-process batch {local:4d} x {SEQ_LEN + 1} (global {global_batch}, {processes} processes): "
                      f"{rate / 1e6:8.1f} M tokens/s")
        text = pipeline.read_text(pipeline.EMBEDDED_CORPUS)
        tok = tokenizer.train([text], 8449)
        if not args.only_prepare:
            text_rate, token_rate = measure_pretokenize(tok, args.encode_copies)
            print(f"pretokenization (encode_batch over documents, all cores): {text_rate / 1e6:.2f} MB/s of text, "
                  f"{token_rate / 1e6:.2f} M tokens/s")
        if args.prepare or args.only_prepare:
            tok_path = tmp / "tokenizer.json"
            tok.save(str(tok_path))
            os.environ["RAYON_NUM_THREADS"] = "1"   # one core per Beam worker process
            results = [measure_prepare(tok_path, tmp / "prepare", args.prepare_mb, w, args.prepare_shards,
                                       args.prepare_runner) for w in (1, 2)]
            for r in results:
                print(f"prepare (Beam {r['runner']} runner, {r['workers']} worker(s), {r['shards']} shards): "
                      f"{r['text_mb']:.0f} MB of text -> {r['tokens'] / 1e6:.1f} M tokens ({r['disk_mb']:.0f} MB) in "
                      f"{r['wall_s']:.1f} s: {r['tokens_per_s'] / 1e6:.2f} M tokens/s wall, "
                      f"{r['tokens_per_s_per_worker'] / 1e6:.2f} M tokens/s per busy worker, "
                      f"{r['tokens_per_cpu_s'] / 1e6:.2f} M tokens per CPU-second; {r['worker_pids']} worker "
                      f"process(es), at most {r['max_concurrent_shards']} shard(s) at once")
            print(f"prepare scaling 1 -> 2 workers (wall): {results[0]['wall_s'] / results[1]['wall_s']:.2f}x")
            print(json.dumps({"prepare": results}))


if __name__ == "__main__":
    main()
