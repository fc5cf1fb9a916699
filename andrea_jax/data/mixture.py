"""`data.mixture`: several prepared token datasets mixed window by window, with grain's `mix`.

Each source is its own endless stream of windows (loader.py's windows of its training part, a new
seeded permutation each epoch, its own seed). grain's MapDataset.mix interleaves the streams by
position: which source stream position k comes from is a fixed function of k and the weights
(grain's integer proportions), so every prefix of the stream holds each source within one window of
its weight's share. The mixed stream is then batched and split per process exactly as loader.py
splits a single source, and its iterator state is again the index of the next batch.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Sequence

import grain
import numpy as np

from andrea_jax.data import loader
from andrea_jax.errors import DataError


@dataclasses.dataclass(frozen=True)
class Mixture:
    names: tuple[str, ...]      # each source's name in metrics (tokens/NAME): its folder's name
    weights: tuple[float, ...]  # normalised to sum 1
    train_parts: tuple          # each source's training tokens (token_shards.ShardedTokens)


def source_names(paths: Sequence[str]) -> tuple[str, ...]:
    """Each path's last component; a name that two sources share gets its entry's index appended."""
    names = [pathlib.PurePosixPath(str(p).rstrip("/")).name or str(i) for i, p in enumerate(paths)]
    return tuple(f"{n}_{i}" if names.count(n) > 1 else n for i, n in enumerate(names))


def int_proportions(weights: Sequence[float]) -> list[int]:
    """Weights as the integer proportions grain's mix works in (the smallest scaled to 100): given
    these, grain keeps them as they are, so `source_counts` sees the same numbers."""
    scale = 100 / min(weights)
    return [int(w * scale) for w in weights]


def source_counts(n_positions: int, weights: Sequence[float]) -> list[int]:
    """How many of mixed stream positions [0, n_positions) each source fills, in closed form: the
    count grain's interleaving gives (tests/test_data_mixture.py checks it against the stream)."""
    proportions = int_proportions(weights)
    remaining, left, counts = sum(proportions), n_positions, []
    for p in proportions:
        rest = left * (remaining - p) // remaining
        counts.append(left - rest)
        remaining, left = remaining - p, rest
    return counts


def _source_seed(seed: int, source: int) -> int:
    return int(np.random.SeedSequence([seed % 2**32, source]).generate_state(1)[0])


def gather_mixed(parts: Sequence, source_ids: np.ndarray, window_ids: np.ndarray, seq_len: int) -> np.ndarray:
    """The rows of a batch of (source, window) ids, each source's rows read in one gather."""
    out = np.empty((len(window_ids), seq_len + 1), np.int32)
    for s in np.unique(source_ids).tolist():
        rows = np.flatnonzero(source_ids == s)
        out[rows] = loader.gather_windows(parts[s], window_ids[rows], seq_len)
    return out


def train_dataset(mixture: Mixture, *, seq_len: int, global_batch: int, seed: int,
                  process_index: int = 0, process_count: int = 1) -> grain.MapDataset:
    """Endless batches [global_batch / process_count, seq_len + 1] of this process's share of the mixture."""
    local = loader.local_batch_size(global_batch, process_count)
    streams = []
    for s, (name, part) in enumerate(zip(mixture.names, mixture.train_parts)):
        n = loader.num_windows(len(part), seq_len)
        if n == 0:
            raise DataError(f"data.mixture source {name}: its training part has {len(part)} tokens, fewer "
                            f"than one window of model.seq_len + 1 = {seq_len + 1}")
        ids = grain.MapDataset.range(n).shuffle(seed=_source_seed(seed, s)).repeat(None)
        streams.append(ids.map(lambda w, s=s: (s, w)))
    mixed = grain.MapDataset.mix(streams, int_proportions(mixture.weights))
    mine = loader.batched(mixed, local)[process_index::process_count]
    parts = mixture.train_parts
    return mine.map(lambda batch: gather_mixed(parts, np.asarray(batch[0]), np.asarray(batch[1]), seq_len))


def tokens_seen(mixture: Mixture, steps: int, global_batch: int, seq_len: int) -> dict[str, int]:
    """{"tokens/NAME": training tokens (targets) each source gave the first `steps` global batches}."""
    counts = source_counts(steps * global_batch, mixture.weights)
    return {f"tokens/{name}": c * seq_len for name, c in zip(mixture.names, counts)}
