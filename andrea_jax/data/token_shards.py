"""The one on-disk token format: a folder of K shards of raw token ids, an index, a manifest.

    DIR/tokens-TOKHASH-00000-of-00003.bin        token ids (uint16, or uint32 past 65,536 tokens),
                                                 `<|endoftext|>` after every document
    DIR/tokens-TOKHASH-00000-of-00003.idx        int64 end offset of each document in its shard
    DIR/tokens-TOKHASH-00000-of-00003.done.json  written after the two above: the shard is complete
    DIR/manifest.json                            written last: the dataset is complete
    DIR/tokenizer.json                           the tokenizer that made the ids (prepare.py)

The concatenation of the shards in order is the dataset's token stream. `ShardedTokens` is that
stream without a copy: each shard is memory-mapped on first use only, so a process opens only the
shards its windows fall in, and a slice is a view (offsets) of the same files. The pretokenize
cache of a training run and `python -m andrea_jax.data.prepare` both write this format.
"""
from __future__ import annotations

import json
import os
import pathlib
import time
from typing import Sequence

import numpy as np

from andrea_jax.data.errors import DataError

FORMAT = "andrea-tokens/1"
MANIFEST = "manifest.json"


def shard_stem(tokenizer_hash: str, index: int, count: int) -> str:
    return f"tokens-{tokenizer_hash}-{index:05d}-of-{count:05d}"


def atomic_write_bytes(path: pathlib.Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def atomic_write_json(path: pathlib.Path, value) -> None:
    atomic_write_bytes(path, json.dumps(value, indent=1).encode())


def read_json(path: pathlib.Path, what: str) -> dict:
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{what} {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{what} {path} is unreadable ({type(e).__name__}); delete it to rebuild") from None
    if not isinstance(value, dict):
        raise DataError(f"{what} {path} is not a JSON object; delete it to rebuild")
    return value


def write_shard(folder: pathlib.Path, stem: str, id_batches, dtype: np.dtype, label: dict) -> dict:
    """Streams (ids, document lengths) batches into shard `stem`; the marker, written last and
    atomically, says the shard is complete and what made it (`label`)."""
    folder = pathlib.Path(folder)
    bin_path, idx_path = folder / f"{stem}.bin", folder / f"{stem}.idx"
    tmp_bin = bin_path.with_name(bin_path.name + f".tmp{os.getpid()}")
    tmp_idx = idx_path.with_name(idx_path.name + f".tmp{os.getpid()}")
    n_tokens = n_docs = 0
    start, cpu_start, started = time.perf_counter(), time.process_time(), time.time()
    with tmp_bin.open("wb") as f_bin, tmp_idx.open("wb") as f_idx:
        for ids, lengths in id_batches:
            np.asarray(ids, dtype).tofile(f_bin)
            (n_tokens + np.cumsum(lengths, dtype=np.int64)).tofile(f_idx)
            n_tokens, n_docs = n_tokens + len(ids), n_docs + len(lengths)
    os.replace(tmp_bin, bin_path)
    os.replace(tmp_idx, idx_path)
    # What it took to make, and where (benchmarks/data.py reads it): not part of the format.
    made = {"seconds": round(time.perf_counter() - start, 3), "cpu_seconds": round(time.process_time() - cpu_start, 3),
            "started": started, "finished": time.time(), "pid": os.getpid()}
    marker = dict(label, file=bin_path.name, tokens=n_tokens, documents=n_docs, dtype=np.dtype(dtype).name, made=made)
    atomic_write_json(folder / f"{stem}.done.json", marker)
    return marker


def complete_shard(folder: pathlib.Path, stem: str, label: dict) -> dict | None:
    """The marker of shard `stem` when it is complete, made with `label` and its files intact; else None."""
    folder = pathlib.Path(folder)
    try:
        marker = json.loads((folder / f"{stem}.done.json").read_text())
        dtype = np.dtype(marker["dtype"])
        ok = (all(marker.get(k) == v for k, v in label.items())
              and (folder / f"{stem}.bin").stat().st_size == marker["tokens"] * dtype.itemsize
              and (folder / f"{stem}.idx").stat().st_size == marker["documents"] * 8)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return marker if ok else None


def write_manifest(folder: pathlib.Path, markers: Sequence[dict], **meta) -> dict:
    markers = sorted(markers, key=lambda m: m["file"])
    manifest = dict(meta, format=FORMAT, dtype=markers[0]["dtype"] if markers else "uint16",
                    tokens=sum(m["tokens"] for m in markers), documents=sum(m["documents"] for m in markers),
                    shards=[{"file": m["file"], "tokens": m["tokens"], "documents": m["documents"]}
                            for m in markers])
    atomic_write_json(pathlib.Path(folder) / MANIFEST, manifest)
    return manifest


def read_manifest(folder: pathlib.Path) -> dict:
    path = pathlib.Path(folder) / MANIFEST
    manifest = read_json(path, "token dataset manifest")
    if manifest.get("format") != FORMAT:
        raise DataError(f"{path} is not a token dataset of format {FORMAT} (it says {manifest.get('format')!r})")
    return manifest


class ShardedTokens:
    """The token stream [lo, hi) of a folder of shards: len(), slices (views), windows, documents."""

    def __init__(self, folder, files: Sequence[str], counts: Sequence[int], dtype, lo: int = 0,
                 hi: int | None = None, _maps: dict | None = None):
        self.folder = pathlib.Path(folder)
        self.files = list(files)
        self.counts = np.asarray(counts, np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)])   # shard s holds [starts[s], starts[s+1])
        self.dtype = np.dtype(dtype)
        self.lo, self.hi = lo, int(self.starts[-1]) if hi is None else hi
        self._maps = {} if _maps is None else _maps                   # shared by views: one mapping per shard

    @classmethod
    def open(cls, folder, expect_tokenizer: str | None = None, tokenizer_name: str = "") -> "ShardedTokens":
        """The prepared token dataset in `folder`, its manifest and shard sizes checked; with
        `expect_tokenizer`, refused when made by another tokenizer."""
        folder = pathlib.Path(folder)
        manifest = read_manifest(folder)
        if expect_tokenizer is not None and manifest.get("tokenizer") != expect_tokenizer:
            raise DataError(f"token dataset {folder} was tokenized by tokenizer {manifest.get('tokenizer')} "
                            f"(its {MANIFEST}) but {tokenizer_name or 'the tokenizer given'} is "
                            f"{expect_tokenizer}: use its own tokenizer.json or prepare it again")
        dtype = np.dtype(manifest["dtype"])
        for shard in manifest["shards"]:
            path = folder / shard["file"]
            size = path.stat().st_size if path.is_file() else None
            if size != shard["tokens"] * dtype.itemsize:
                state = "is missing" if size is None else f"has {size:,} bytes, not {shard['tokens'] * dtype.itemsize:,}"
                raise DataError(f"token shard {path} {state}: prepare the dataset again (a rerun "
                                f"redoes only the missing shards once {folder / MANIFEST} is deleted)")
        return cls(folder, [s["file"] for s in manifest["shards"]], [s["tokens"] for s in manifest["shards"]],
                   dtype)

    def __len__(self) -> int:
        return self.hi - self.lo

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def shard(self, s: int) -> np.ndarray:
        """Shard s memory-mapped (opened on first use, then kept)."""
        if s not in self._maps:
            path = self.folder / self.files[s]
            try:
                self._maps[s] = np.memmap(path, dtype=self.dtype, mode="r", shape=(int(self.counts[s]),)) \
                    if self.counts[s] else np.zeros(0, self.dtype)
            except (OSError, ValueError) as e:
                raise DataError(f"token shard {path} is unreadable ({type(e).__name__}: {e})") from None
        return self._maps[s]

    def opened_shards(self) -> list[int]:
        return sorted(self._maps)

    def _range(self, start: int, stop: int) -> np.ndarray:
        """Absolute positions [start, stop) as one array: a view when in one shard, else a copy."""
        s = int(np.searchsorted(self.starts, start, side="right")) - 1
        if stop <= self.starts[s + 1]:
            return self.shard(s)[start - self.starts[s]: stop - self.starts[s]]
        parts = []
        while start < stop:
            end = min(stop, int(self.starts[s + 1]))
            if end > start:  # an empty shard is never opened
                parts.append(self.shard(s)[start - self.starts[s]: end - self.starts[s]])
            start, s = end, s + 1
        return np.concatenate(parts)

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return np.asarray(self)[key]
            stop = max(start, stop)
            return ShardedTokens(self.folder, self.files, self.counts, self.dtype, self.lo + start,
                                 self.lo + stop, self._maps)
        i = int(key) + (len(self) if int(key) < 0 else 0)
        if not 0 <= i < len(self):
            raise IndexError(key)
        return self._range(self.lo + i, self.lo + i + 1)[0]

    def __array__(self, dtype=None, copy=None):
        flat = self._range(self.lo, self.hi) if len(self) else np.zeros(0, self.dtype)
        return np.asarray(flat, dtype) if dtype is not None else np.asarray(flat)

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """int32 [len(starts), length]: the tokens at [start, start + length) of each start."""
        out = np.empty((len(starts), length), np.int32)
        for row, start in enumerate(np.asarray(starts, np.int64) + self.lo):
            out[row] = self._range(int(start), int(start) + length)
        return out

    def document_ends(self, s: int) -> np.ndarray:
        """int64 end offsets of shard s's documents, within the shard (from its index)."""
        path = (self.folder / self.files[s]).with_suffix(".idx")
        return np.fromfile(path, np.int64)
