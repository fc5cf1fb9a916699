"""Loader throughput of data.mixture against a single prepared dataset.

Tokens per second out of one process's grain iterator at ANDREA-120M's shapes (windows of 1025
tokens), the code the trainer runs: `loader.train_dataset` on one synthetic token dataset of
--n-tokens tokens, and `mixture.train_dataset` on --sources synthetic datasets of --n-tokens /
--sources tokens each (weights 1, 2, ..., normalised), all with --shards shards and documents
averaging --doc-tokens tokens (benchmarks/data.py's synthetic datasets, in the page cache). Best
of --repeats runs of --batches batches after a warm-up of 3.

    python benchmarks/data_mixture.py                  # 64M tokens, 3 sources
    python benchmarks/data_mixture.py --doc-tokens 50  # short documents
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from andrea_jax.data import loader, mixture  # noqa: E402
from data import SEQ_LEN, SHAPES, synthetic_dataset  # noqa: E402  (benchmarks/data.py)


def measure(make_dataset, global_batch: int, process_count: int, batches: int, repeats: int, threads: int) -> float:
    best = 0.0
    for r in range(repeats):
        it = loader.train_iterator(make_dataset(seq_len=SEQ_LEN, global_batch=global_batch, seed=r,
                                                process_index=process_count - 1, process_count=process_count),
                                   num_threads=threads)
        for _ in range(3):
            next(it)
        start = time.perf_counter()
        n = sum(next(it).size for _ in range(batches))
        best = max(best, n / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-tokens", type=int, default=64 << 20, help="tokens in all (the mixture: split evenly)")
    parser.add_argument("--sources", type=int, default=3)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--doc-tokens", type=int, default=500)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="grain ReadOptions.num_threads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        single = synthetic_dataset(tmp / "single", args.n_tokens, args.shards, args.doc_tokens)
        parts = tuple(synthetic_dataset(tmp / f"part{s}", args.n_tokens // args.sources, args.shards,
                                        args.doc_tokens) for s in range(args.sources))
        weights = tuple(w / sum(range(1, args.sources + 1)) for w in range(1, args.sources + 1))
        mixed = mixture.Mixture(tuple(f"part{s}" for s in range(args.sources)), weights, parts)
        print(f"{args.n_tokens:,} tokens, {args.shards} shards per dataset, documents of {args.doc_tokens} tokens "
              f"on average, seq_len {SEQ_LEN}, {args.threads} grain threads")
        for global_batch, processes in SHAPES:
            one = measure(lambda **kw: loader.train_dataset(single, **kw), global_batch, processes,
                          args.batches, args.repeats, args.threads)
            mix = measure(lambda **kw: mixture.train_dataset(mixed, **kw), global_batch, processes,
                          args.batches, args.repeats, args.threads)
            print(f"  per-process batch {global_batch // processes:4d} (global {global_batch}, {processes} processes): "
                  f"single {one / 1e6:6.1f} M tokens/s, mixture of {args.sources} {mix / 1e6:6.1f} M tokens/s "
                  f"({mix / one:.2f}x)")


if __name__ == "__main__":
    main()
