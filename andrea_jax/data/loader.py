"""Packed windows -> seeded shuffle -> per-process batches -> background prefetch, with grain;
and the loader's resumable state.

Window i is tokens[i*T : i*T + T + 1] (T = seq_len): windows overlap by the one token that is both
the last target of one and the first input of the next, and nothing is padded. The stream of window
ids is global: each epoch is a new seeded permutation of all windows (grain's index shuffle), and
global batch k is stream positions [k*B, (k+1)*B). Process p of P reads rows [p*B/P, (p+1)*B/P) of
every global batch, so the shares are disjoint and together read every window of every epoch
exactly once (a batch may straddle two epochs; no window is dropped). A batch is one grain element:
grain shuffles and groups only integer ids, and one gather per batch copies the windows out of the
tokens: an array, or a token dataset (token_shards.ShardedTokens), where window w's start w*T maps
to (shard, record, offset), a shard is opened when a window first needs it, and each shard's records
of the batch are one array_record read.

The iterator's state is the index of the next global batch, the same on every process: it restores
onto any process count that divides the same global batch (see `state_fingerprint`).

**Changing shapes** (a ramp, andrea_jax.ramps): `staged_dataset` reads the same stream of shuffled
windows of the full seq_len, but step k takes the next windows that its B x t tokens fill (a whole
number of them: the config checks it) and cuts each window into seq_len / t rows of t + 1 tokens,
which overlap by one token as windows do. So every token of the stream is served once, in order,
whatever the shapes; the state is again the index of the next step, and the stream position of step
k is the tokens the steps before it saw, which the plan gives.
"""
from __future__ import annotations

import grain
import numpy as np

from andrea_jax.errors import DataError

STATE_FORMAT = 1


def num_windows(n_tokens: int, seq_len: int) -> int:
    return max(0, (n_tokens - 1) // seq_len)


def gather_windows(tokens, window_ids, seq_len: int) -> np.ndarray:
    """Windows [len(window_ids), seq_len + 1] as int32: by fancy indexing from an array, or
    shard by shard from a token_shards.ShardedTokens (window start -> (shard, record, offset))."""
    starts = np.asarray(window_ids, np.int64) * seq_len
    if hasattr(tokens, "windows"):
        return tokens.windows(starts, seq_len + 1)
    return np.asarray(tokens[starts[:, None] + np.arange(seq_len + 1)], np.int32)


def local_batch_size(global_batch: int, process_count: int) -> int:
    if global_batch % process_count:
        raise DataError(f"train.batch_size={global_batch} is not divisible by the {process_count} processes")
    return global_batch // process_count


# Endless in practice. An endless grain stream is sys.maxsize long, and grain's batch divides that
# length in floating point: at batch 1 the quotient rounds above sys.maxsize and len() overflows.
STREAM_LENGTH = 2**62


def batched(stream: grain.MapDataset, batch_size: int) -> grain.MapDataset:
    """An endless stream's first STREAM_LENGTH items in batches of batch_size."""
    return stream[:STREAM_LENGTH].batch(batch_size)


def window_stream(n_windows: int, seed: int) -> grain.MapDataset:
    """The endless stream of window ids: each epoch a new seeded permutation of all windows."""
    return grain.MapDataset.range(n_windows).shuffle(seed=seed % 2**32).repeat(None)


def train_dataset(tokens, *, seq_len: int, global_batch: int, seed: int,
                  process_index: int = 0, process_count: int = 1) -> grain.MapDataset:
    """Endless batches [global_batch / process_count, seq_len + 1] of this process's share."""
    n = num_windows(len(tokens), seq_len)
    local = local_batch_size(global_batch, process_count)
    if n < global_batch:
        raise DataError(f"the training tokens make {n} windows of seq_len + 1 = {seq_len + 1}, fewer than "
                        f"one batch of train.batch_size={global_batch}: use a larger corpus (data.source=files or "
                        f"tfds) or --set train.batch_size=N with N <= {n}")
    window_ids = window_stream(n, seed)
    # Local batch m holds stream positions [m*local, (m+1)*local); global batch k is m = k*P .. k*P + P-1.
    mine = batched(window_ids, local)[process_index::process_count]
    return mine.map(lambda ids: gather_windows(tokens, ids, seq_len))


def cut_rows(windows_WT1: np.ndarray, length: int) -> np.ndarray:
    """Windows [W, T + 1] cut into rows [W * T / length, length + 1], each window's in order."""
    starts = np.arange(0, windows_WT1.shape[1] - 1, length)
    return windows_WT1[:, starts[:, None] + np.arange(length + 1)].reshape(-1, length + 1)


def staged_dataset(tokens, *, seq_len: int, full_batch: int, seed: int, stage, process_index: int = 0,
                   process_count: int = 1) -> grain.MapDataset:
    """Endless batches of changing shape: element k is step k's [B / process_count, t + 1] share, where
    stage(k) = (B, t, the stream position of its first window) (andrea_jax.ramps: the plan's shape and
    tokens seen over seq_len)."""
    n = num_windows(len(tokens), seq_len)
    if n < full_batch:
        raise DataError(f"the training tokens make {n} windows of seq_len + 1 = {seq_len + 1}, fewer than "
                        f"one batch of train.batch_size={full_batch}: use a larger corpus or a smaller batch")
    window_ids = window_stream(n, seed)

    def batch(step: int) -> np.ndarray:
        rows, length, first = stage(step)
        local, per_window = local_batch_size(rows, process_count), seq_len // length
        lo = process_index * local   # this process's rows [lo, lo + local) of the step's
        w0, w1 = lo // per_window, -(-(lo + local) // per_window)
        windows = gather_windows(tokens, [window_ids[first + w] for w in range(w0, w1)], seq_len)
        return cut_rows(windows, length)[lo - w0 * per_window:][:local]
    return grain.MapDataset.range(2**62).map(batch)   # element k: step k's batch (2**62: endless in practice)


def train_iterator(dataset: grain.MapDataset, *, num_threads: int = 2, prefetch: int = 4):
    """A grain iterator with get_state / set_state, computing batches ahead in background threads."""
    return iter(dataset.to_iter_dataset(grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch)))


def val_batches(tokens, *, seq_len: int, global_batch: int, max_batches: int,
                process_index: int = 0, process_count: int = 1) -> list[np.ndarray]:
    """The fixed validation set: the first windows of `tokens` in order, cut into global batches
    (the last may be smaller, its size a multiple of process_count), this process's rows of each."""
    n = min(num_windows(len(tokens), seq_len), global_batch * max_batches)
    batches = []
    for start in range(0, n, global_batch):
        local = min(global_batch, n - start) // process_count
        if local:
            first = start + process_index * local
            batches.append(gather_windows(tokens, np.arange(first, first + local), seq_len))
    return batches


def state_fingerprint(*, tokens_key: str, n_tokens: int, seq_len: int, global_batch: int, seed: int) -> dict:
    """What a saved state must match to continue exactly; the process count is not part of it."""
    return {"tokens": tokens_key, "n_tokens": int(n_tokens), "seq_len": seq_len,
            "global_batch": global_batch, "seed": seed}


def get_state(iterator, fingerprint: dict) -> dict:
    """The loader's position as a JSON-able dict."""
    return {"format": STATE_FORMAT, "grain": iterator.get_state(), "data": fingerprint}


def set_state(iterator, state: dict, fingerprint: dict, where: str = "the saved data state") -> None:
    """Moves `iterator` to the saved position; the next batch is the one that would have come next."""
    if state.get("format") != STATE_FORMAT or "grain" not in state:
        raise DataError(f"{where} is not a loader state of format {STATE_FORMAT}")
    if state.get("data") != fingerprint:
        diff = ", ".join(f"{k}: saved {state.get('data', {}).get(k)!r}, now {v!r}"
                         for k, v in fingerprint.items() if state.get("data", {}).get(k) != v)
        raise DataError(f"{where} belongs to other data or batching ({diff}); the loader cannot continue there")
    iterator.set_state(state["grain"])
