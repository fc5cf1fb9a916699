"""Corpus -> tokens -> packed windows -> shuffled batches, through grain.

Tokens are packed into windows of seq_len + 1 with no padding (window i starts at token i*seq_len,
so the targets of one window are its inputs shifted by one). The validation part is the tail of
the token stream, fixed for a given corpus and tokenizer. Each process reads only its share of the
training windows.
"""
from __future__ import annotations

import dataclasses
import pathlib

import grain
import numpy as np
from tokenizers import Tokenizer

from andrea_jax.data import tokenizer as tokenizer_lib

EMBEDDED_CORPUS = pathlib.Path(__file__).resolve().parent / "tinyshakespeare.txt"


class DataError(ValueError):
    """Bad input data: the message names the file."""


@dataclasses.dataclass(frozen=True)
class TokenizedCorpus:
    tokenizer: Tokenizer
    train_tokens: np.ndarray   # uint16/uint32 token ids, end-of-text between documents
    val_tokens: np.ndarray


def read_text(path: pathlib.Path) -> str:
    if not path.is_file():
        raise DataError(f"corpus file {path} does not exist")
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise DataError(f"corpus file {path} is empty")
    return text


def corpus_text(source: str) -> str:
    if source == "embedded":
        return read_text(EMBEDDED_CORPUS)
    raise DataError(f"unknown data source {source!r}")


def tokenize(tok: Tokenizer, text: str) -> np.ndarray:
    ids = tokenizer_lib.encode(tok, text)
    dtype = np.uint16 if tok.get_vocab_size() <= np.iinfo(np.uint16).max else np.uint32
    return np.asarray(ids, dtype)


def prepare(*, source: str, vocab_size: int, val_fraction: float, seq_len: int,
            tokenizer_path: str = "", cache_dir=None) -> TokenizedCorpus:
    """Reads and tokenizes the corpus and splits off the validation tail."""
    text = corpus_text(source)
    if tokenizer_path:
        tok = tokenizer_lib.load(tokenizer_path)
    else:
        tok = tokenizer_lib.load_or_train(text, vocab_size, cache_dir)
    if tok.get_vocab_size() != vocab_size:
        raise DataError(f"tokenizer has {tok.get_vocab_size()} tokens but model.vocab_size is {vocab_size}")
    tokens = tokenize(tok, text)
    n_val = int(len(tokens) * val_fraction)
    train_tokens, val_tokens = tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val:]
    for name, part in (("training", train_tokens), ("validation", val_tokens)):
        if len(part) < seq_len + 1:
            raise DataError(f"the {name} part of corpus {source!r} has {len(part)} tokens, "
                            f"fewer than one window of seq_len + 1 = {seq_len + 1}")
    return TokenizedCorpus(tok, train_tokens, val_tokens)


class Windows(grain.sources.RandomAccessDataSource):
    """Random access to the packed windows [seq_len + 1] of a token array."""

    def __init__(self, tokens: np.ndarray, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i: int) -> np.ndarray:
        start = int(i) * self.seq_len
        return self.tokens[start: start + self.seq_len + 1].astype(np.int32)


def train_dataset(tokens: np.ndarray, *, seq_len: int, batch_size: int, seed: int,
                  process_index: int = 0, process_count: int = 1) -> grain.MapDataset:
    """Endless seeded shuffle of this process's windows, reshuffled every epoch, in batches."""
    windows = grain.MapDataset.source(Windows(tokens, seq_len))[process_index::process_count]
    if len(windows) < batch_size:
        raise DataError(f"{len(windows)} training windows per process, fewer than one batch of {batch_size}")
    return windows.shuffle(seed=seed).repeat(None).batch(batch_size, drop_remainder=True)


def train_iterator(dataset: grain.MapDataset, prefetch: int = 4):
    """A grain iterator (checkpointable with get_state/set_state), prefetching in threads."""
    return iter(dataset.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=prefetch)))


def val_batches(tokens: np.ndarray, *, seq_len: int, batch_size: int, max_batches: int) -> list[np.ndarray]:
    """The fixed validation set: the first windows of the validation tail, in order."""
    windows = Windows(tokens, seq_len)
    n = min(len(windows), batch_size * max_batches)
    rows = np.stack([windows[i] for i in range(n)])
    return [rows[i: i + batch_size] for i in range(0, n, batch_size)]
