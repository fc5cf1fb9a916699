"""A seeded, uniform sample of a corpus's documents, for training the tokenizer.

Every document gets a pseudo-random 64-bit key from (seed, its id); the sample is the documents of
smallest key (bottom-k sampling: a uniform sample without replacement, from anywhere in the corpus,
computable in parallel and in one pass, e.g. by Beam's `Top.Smallest`). The sampled documents are
then used in corpus order, so a corpus smaller than the budget trains on itself, unchanged.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from andrea_jax.data import documents


def keys(doc_ids, seed: int) -> np.ndarray:
    """uint64 keys of integer document ids (splitmix64 of seed-mixed ids)."""
    with np.errstate(over="ignore"):
        z = np.asarray(doc_ids, np.uint64) + np.uint64(seed % 2**64) * np.uint64(0x9E3779B97F4A7C15) \
            + np.uint64(0x632BE59BD9B4E019)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def doc_id(unit: int, index: int) -> int:
    """The integer id of document `index` of input unit (file, record range) `unit`."""
    return unit << 32 | index


def sample_texts(records: Sequence, max_chars: int, seed: int = 0) -> Iterator[str]:
    """About `max_chars` of text: the documents of smallest key, in corpus order."""
    order = np.argsort(keys(np.arange(len(records)), seed), kind="stable")
    chosen, seen = [], 0
    for start in range(0, len(order), 4096):
        ids = order[start:start + 4096]
        for i, text in zip(ids, documents.record_texts(_Subset(records, ids))):
            chosen.append((int(i), text))
            seen += len(text)
            if seen >= max_chars:
                break
        if seen >= max_chars:
            break
    return (text for _, text in sorted(chosen))


class _Subset:
    """Records `ids` of `records`, as a random-access sequence."""

    def __init__(self, records, ids):
        self.records, self.ids = records, [int(i) for i in ids]

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return self.records[self.ids[i]]

    def __getitems__(self, idx):
        many = getattr(self.records, "__getitems__", None)
        wanted = [self.ids[i] for i in idx]
        return many(wanted) if many else [self.records[i] for i in wanted]
