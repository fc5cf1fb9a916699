"""Documents -> token ids, `<|endoftext|>` after every document, cached on disk.

Tokenization runs once per (dataset, split, tokenizer): HF `tokenizers` encodes batches of documents
in parallel (Rust threads) and the ids stream into the folder `tokens-SPLIT-TOKHASH/` beside the
dataset, a token dataset of one shard (token_shards.py: a TFDS array_record dataset, the format
andrea_jax.data.prepare writes with K); its manifest, written last, marks it complete. Later runs read it and
tokenize nothing.
"""
from __future__ import annotations

import hashlib
import itertools
import pathlib
import re
import shutil
from typing import Iterator, Sequence

import numpy as np
from tokenizers import Tokenizer

from andrea_jax.data import documents, shard_writer, token_shards, tokenizer as tokenizer_lib

BATCH_BYTES = 16 << 20    # text per encode_batch call: large enough to keep every core busy


def tokenizer_hash(tok: Tokenizer) -> str:
    return hashlib.sha256(tok.to_str().encode()).hexdigest()[:16]


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def _batches(texts: Iterator[str]) -> Iterator[list[str]]:
    batch, size = [], 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def encode_batch(tok: Tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The one place that tokenizes: (every document's ids followed by end-of-text, concatenated;
    the length of each document's part)."""
    encodings = tok.encode_batch_fast(texts)
    eot = (tokenizer_lib.eot_id(tok),)
    lengths = np.fromiter((len(e.ids) + 1 for e in encodings), np.int64, count=len(encodings))
    ids = itertools.chain.from_iterable(itertools.chain(e.ids, eot) for e in encodings)
    return np.fromiter(ids, token_dtype(tok.get_vocab_size()), count=int(lengths.sum())), lengths


def encode_documents(tok: Tokenizer, texts: list[str]) -> np.ndarray:
    """Every document's ids followed by end-of-text, concatenated."""
    return encode_batch(tok, texts)[0]


def encode_stream(tok: Tokenizer, texts: Iterator[str]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(ids, document lengths) of the texts, encoded a batch of about BATCH_BYTES at a time."""
    for batch in _batches(texts):
        yield encode_batch(tok, batch)


def safe_name(split: str) -> str:
    """A split spec (e.g. `train[:10%]`) as part of a file name."""
    return re.sub(r"[^A-Za-z0-9_.%-]+", "_", split)


def cache_folder(cache_dir: pathlib.Path, split: str, tok: Tokenizer) -> pathlib.Path:
    return pathlib.Path(cache_dir) / f"tokens-{safe_name(split)}-{tokenizer_hash(tok)}"


def load_or_tokenize(records: Sequence, tok: Tokenizer, cache_dir: pathlib.Path, split: str,
                     source_name: str) -> token_shards.ShardedTokens:
    """The split's token ids as a one-shard token dataset (token_shards.py, the format andrea_jax.data.prepare
    writes with many), read from the cache; tokenized (once) when not cached."""
    folder = cache_folder(cache_dir, split, tok)
    tok_hash = tokenizer_hash(tok)
    manifest = folder / token_shards.MANIFEST
    if manifest.is_file() and not token_shards.is_current(folder):
        shutil.rmtree(folder)   # a cache in an older token format: ours to remake
    if not manifest.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        label = {"source": source_name, "split": split, "tokenizer": tok_hash}
        marker = shard_writer.write_shard(folder, token_shards.shard_file(0, 1),
                                          encode_stream(tok, documents.record_texts(records)),
                                          token_dtype(tok.get_vocab_size()), label)
        shard_writer.write_manifest(folder, [marker], **label)  # last: a folder with a manifest is complete
        print(f"data: tokenized {marker['documents']:,} document(s) of {source_name} ({split}) into "
              f"{marker['tokens']:,} tokens in {folder}", flush=True)
    return token_shards.ShardedTokens.open(folder, expect_tokenizer=tok_hash)
