"""Loader throughput alone, on pretokenized data: tokens/s out of the grain iterator of one process.

A flat uint16 token file (the pretokenized cache's format) is memory-mapped and fed through the
same `loader.train_dataset` / `train_iterator` the trainer uses, at ANDREA-120M's shapes (seq_len
1024, so windows of 1025 tokens). Each shape reports the best of --repeats timed runs of --batches
batches after a warm-up; the OS page cache holds the file, as it does for a dataset read every epoch.

    python benchmarks/data.py                      # synthetic 64M-token file in a temp folder
    python benchmarks/data.py --tokens PATH.bin    # a real cache written by the pipeline

The last line times the one-off pretokenization (HF tokenizers batch encoding over documents, as
a dataset build does it) on the embedded corpus cut into paragraphs, with its 8449-token BPE.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from andrea_jax.data import loader, pipeline, pretokenize, tokenizer  # noqa: E402

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


def measure_pretokenize(copies: int) -> tuple[float, float]:
    text = pipeline.read_text(pipeline.EMBEDDED_CORPUS)
    tok = tokenizer.train([text], 8449)
    docs = text.split("\n\n") * copies
    start = time.perf_counter()
    ids = pretokenize.encode_documents(tok, docs)
    seconds = time.perf_counter() - start
    return sum(len(d.encode()) for d in docs) / seconds, len(ids) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", help="a flat uint16 token file (.bin); default: a synthetic one")
    parser.add_argument("--n-tokens", type=int, default=64 << 20, help="size of the synthetic file")
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="grain ReadOptions.num_threads")
    parser.add_argument("--encode-copies", type=int, default=4, help="copies of the corpus to pretokenize")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(args.tokens or pathlib.Path(tmp) / "tokens.bin")
        if not args.tokens:
            np.random.default_rng(0).integers(0, 8449, args.n_tokens, dtype=np.uint16).tofile(path)
        tokens = np.memmap(path, dtype=np.uint16, mode="r")
        print(f"{len(tokens):,} tokens from {path if args.tokens else 'a synthetic file'}, "
              f"seq_len {SEQ_LEN}, {args.threads} grain threads")
        for global_batch, processes in SHAPES:
            local = global_batch // processes
            rate = measure(tokens, global_batch, processes, args.batches, args.repeats, args.threads)
            print(f"per-process batch {local:4d} x {SEQ_LEN + 1} (global {global_batch}, {processes} processes): "
                  f"{rate / 1e6:8.1f} M tokens/s")
    text_rate, token_rate = measure_pretokenize(args.encode_copies)
    print(f"pretokenization (encode_batch over documents): {text_rate / 1e6:.2f} MB/s of text, "
          f"{token_rate / 1e6:.2f} M tokens/s")


if __name__ == "__main__":
    main()
