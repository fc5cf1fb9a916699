"""Documents -> one flat array of token ids, `<|endoftext|>` after every document, cached on disk.

Tokenization runs once per (dataset, split, tokenizer): HF `tokenizers` encodes batches of documents
in parallel (Rust threads) and the ids stream into `tokens-SPLIT-TOKHASH.bin` (raw uint16, or uint32
for vocabularies over 65,536) beside the dataset; a JSON sidecar, written last, marks it complete.
Later runs memory-map the file and tokenize nothing.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import pathlib
import re
from typing import Iterator, Sequence

import numpy as np
from tokenizers import Tokenizer

from andrea_jax.data import tokenizer as tokenizer_lib
from andrea_jax.data.errors import DataError

BATCH_BYTES = 16 << 20    # text per encode_batch call: large enough to keep every core busy
READ_RECORDS = 512        # records fetched from the dataset per read


def tokenizer_hash(tok: Tokenizer) -> str:
    return hashlib.sha256(tok.to_str().encode()).hexdigest()[:16]


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def iter_texts(records: Sequence, max_bytes: int | None = None) -> Iterator[str]:
    """The documents' texts in order, stopping after about `max_bytes` of text when given."""
    seen = 0
    read_many = getattr(records, "__getitems__", lambda ids: [records[i] for i in ids])
    for start in range(0, len(records), READ_RECORDS):
        for record in read_many(range(start, min(start + READ_RECORDS, len(records)))):
            text = record["text"]
            text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
            yield text
            seen += len(text)
            if max_bytes is not None and seen >= max_bytes:
                return


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


def encode_documents(tok: Tokenizer, texts: list[str]) -> np.ndarray:
    """The one place that tokenizes: every document's ids followed by end-of-text, concatenated."""
    encodings = tok.encode_batch_fast(texts)
    eot = (tokenizer_lib.eot_id(tok),)
    total = sum(len(e.ids) + 1 for e in encodings)
    ids = itertools.chain.from_iterable(itertools.chain(e.ids, eot) for e in encodings)
    return np.fromiter(ids, token_dtype(tok.get_vocab_size()), count=total)


def safe_name(split: str) -> str:
    """A split spec (e.g. `train[:10%]`) as part of a file name."""
    return re.sub(r"[^A-Za-z0-9_.%-]+", "_", split)


def _paths(cache_dir: pathlib.Path, split: str, tok: Tokenizer) -> tuple[pathlib.Path, pathlib.Path]:
    stem = f"tokens-{safe_name(split)}-{tokenizer_hash(tok)}"
    return cache_dir / f"{stem}.bin", cache_dir / f"{stem}.json"


def load_or_tokenize(records: Sequence, tok: Tokenizer, cache_dir: pathlib.Path, split: str,
                     source_name: str) -> np.ndarray:
    """The split's token ids, memory-mapped from the cache; tokenized (once) when not cached."""
    bin_path, meta_path = _paths(cache_dir, split, tok)
    if not meta_path.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = bin_path.with_name(bin_path.name + f".tmp{os.getpid()}")
        n_tokens = n_docs = 0
        with tmp.open("wb") as f:
            for batch in _batches(iter_texts(records)):
                ids = encode_documents(tok, batch)
                ids.tofile(f)
                n_tokens, n_docs = n_tokens + len(ids), n_docs + len(batch)
        os.replace(tmp, bin_path)
        meta = {"source": source_name, "split": split, "tokenizer": tokenizer_hash(tok),
                "dtype": token_dtype(tok.get_vocab_size()).name, "tokens": n_tokens, "documents": n_docs}
        tmp = meta_path.with_name(meta_path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(meta, indent=1))
        os.replace(tmp, meta_path)  # last: a cache with its sidecar is always complete
        print(f"data: tokenized {n_docs:,} document(s) of {source_name} ({split}) into {n_tokens:,} tokens "
              f"in {bin_path}", flush=True)
    meta = json.loads(meta_path.read_text())
    dtype = np.dtype(meta["dtype"])
    if not bin_path.is_file() or bin_path.stat().st_size != meta["tokens"] * dtype.itemsize:
        raise DataError(f"token cache {bin_path} is missing or truncated: delete it and {meta_path} to rebuild")
    if meta["tokens"] == 0:
        return np.zeros(0, dtype)
    return np.memmap(bin_path, dtype=dtype, mode="r", shape=(meta["tokens"],))
