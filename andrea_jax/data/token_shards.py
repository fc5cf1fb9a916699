"""The one on-disk token format: a TFDS dataset in `array_record` format, one record per document,
K shards, with an index of token offsets and a manifest.

    DIR/andrea_tokens-train.array_record-00000-of-00003             records: one per document, a
                                                                    serialized tf.train.Example whose
                                                                    feature `tokens` is the document's
                                                                    ids + `<|endoftext|>` as raw uint16
                                                                    bytes (uint32: a vocabulary > 65,536)
    DIR/andrea_tokens-train.array_record-00000-of-00003.index.npy   int64 end offset of each record's
                                                                    tokens in the shard's stream
    DIR/andrea_tokens-train.array_record-00000-of-00003.done.json   written after the two above: the
                                                                    shard is complete, and what made it
    DIR/dataset_info.json, features.json      TFDS's metadata: the shards' lengths, the feature
                                              (Tensor(shape=(None,), encoding=BYTES)), the tokenizer
                                              hash as the config name
    DIR/manifest.json                         written last: the dataset is complete
    DIR/tokenizer.json                        the tokenizer that made the ids (andrea_jax.data.prepare)

TFDS reads it as it is, without TensorFlow: `tfds.builder_from_directory(DIR).as_data_source("train")`
gives every document as {"tokens": ids}. The concatenation of the documents, shard by shard in
order, is the dataset's token stream. `ShardedTokens` is that stream: a window's start maps through
the index to (shard, record, offset) with a binary search, a shard's reader is opened on first use
only (so a process opens only the shards its windows fall in), and a batch of windows is one
array_record read per shard of all the records it needs, decoded with numpy (the record's last
bytes are the ids; the Example header before them is checked, not parsed). Records are written
uncompressed, one per chunk (`group_size:1`, as TFDS writes them): token ids barely compress and
random access reads them twice as fast. The pretokenize cache of a training run (1 shard) and
`python -m andrea_jax.data.prepare` (K shards) both write this format.
"""
from __future__ import annotations

import io
import json
import threading
from typing import Sequence

import numpy as np

from andrea_jax.data import storage
from andrea_jax.errors import DataError

FORMAT = "andrea-tokens/2"
MANIFEST = "manifest.json"
DATASET = "andrea_tokens"   # the TFDS dataset name: it prefixes the shard files
SPLIT = "train"
FEATURE = "tokens"
WRITER_OPTIONS = "group_size:1,uncompressed"
READER_OPTIONS = "readahead_buffer_size:0"   # random access: no read-ahead past the records asked for


def shard_file(index: int, count: int) -> str:
    """TFDS's own name of shard `index` of `count` (its `{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}`)."""
    return f"{DATASET}-{SPLIT}.array_record-{index:05d}-of-{count:05d}"


def index_file(shard: str) -> str:
    return f"{shard}.index.npy"


def marker_file(shard: str) -> str:
    return f"{shard}.done.json"


def read_json(path, what: str) -> dict:
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{what} {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{what} {path} is unreadable ({type(e).__name__}); delete it to rebuild") from None
    if not isinstance(value, dict):
        raise DataError(f"{what} {path} is not a JSON object; delete it to rebuild")
    return value


# ---------------------------------------------------------------------------------------------
# A record: the tf.train.Example {"tokens": bytes_list[raw ids]} that TFDS's
# Tensor(shape=(None,), encoding=BYTES) feature serializes, built and read here without protobuf.

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(payload_len: int) -> bytes:   # tag 1, wire type 2 (length-delimited): 0x0a
    return b"\x0a" + _varint(payload_len)


_HEADERS: dict[int, bytes] = {}


def record_header(n_bytes: int) -> bytes:
    """The serialized Example up to its ids: Example.features > Features.feature["tokens"] >
    Feature.bytes_list > BytesList.value, each a length-delimited field 1 (the map value is field 2)."""
    header = _HEADERS.get(n_bytes)
    if header is None:
        bytes_list = _field(n_bytes)                                         # BytesList.value[0]
        feature = _field(len(bytes_list) + n_bytes) + bytes_list             # Feature.bytes_list
        key = _field(len(FEATURE)) + FEATURE.encode()                        # the map entry's key
        value = b"\x12" + _varint(len(feature) + n_bytes)                    # ... and value (field 2)
        entry = _field(len(key) + len(value) + len(feature) + n_bytes) + key + value + feature
        header = _field(len(entry) + n_bytes) + entry                        # Example.features
        _HEADERS[n_bytes] = header
    return header


def is_current(folder) -> bool:
    """Whether `folder` holds a manifest of this format (a cache of an older one is remade)."""
    try:
        return json.loads((storage.path(folder) / MANIFEST).read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def read_manifest(folder) -> dict:
    path = storage.path(folder) / MANIFEST
    manifest = read_json(path, "token dataset manifest")
    if manifest.get("format") != FORMAT:
        raise DataError(f"{path} is not a token dataset of format {FORMAT} (it says {manifest.get('format')!r}): "
                        f"prepare it again")
    return manifest


# ---------------------------------------------------------------------------------------------
# Reading.

class _Shard:
    """One opened shard: its array_record reader and its records' token offsets."""

    def __init__(self, path, n_records: int):
        from array_record.python import array_record_module

        self.path = path
        try:
            # Read from its bytes, not memory-mapped: the same for a file and an object.
            self.ends = np.load(io.BytesIO(path.with_name(index_file(path.name)).read_bytes()), allow_pickle=False)
            self.reader = array_record_module.ArrayRecordReader(str(path), READER_OPTIONS)
            found = self.reader.num_records()
        except (OSError, ValueError, RuntimeError) as e:
            raise DataError(f"token shard {path} is unreadable ({type(e).__name__}: {str(e).splitlines()[0]}): "
                            f"prepare the dataset again") from None
        if found != n_records or self.ends.shape != (n_records,):
            raise DataError(f"token shard {path} has {found:,} records and an index of {self.ends.shape[0]:,}, "
                            f"not {n_records:,}: prepare the dataset again")

    def starts(self, records: np.ndarray) -> np.ndarray:
        return np.where(records > 0, self.ends[np.maximum(records - 1, 0)], 0)

    def read(self, records: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """The tokens of `records` (sorted, distinct), concatenated: one read of them all, the
        Example headers checked and cut out with numpy (no per-record parsing)."""
        sizes = (self.ends[records] - self.starts(records)) * dtype.itemsize
        try:
            raw = self.reader.read(records.tolist())
        except RuntimeError as e:   # Riegeli's chunk hashes: a damaged file
            raise DataError(f"token shard {self.path} is unreadable ({str(e).splitlines()[0]}): "
                            f"prepare the dataset again") from None
        headers = list(map(record_header, sizes.tolist()))
        head_lens = np.fromiter(map(len, headers), np.int64, count=len(headers))
        lens = np.fromiter(map(len, raw), np.int64, count=len(raw))
        data = np.frombuffer(b"".join(raw), np.uint8)
        # Where each record's header lies in `data`: record k's bytes start at at[k].
        at = np.cumsum(lens) - lens
        head_at = np.repeat(at - (np.cumsum(head_lens) - head_lens), head_lens) + np.arange(int(head_lens.sum()))
        ok = lens == head_lens + sizes
        if ok.all():
            ok = data[head_at] == np.frombuffer(b"".join(headers), np.uint8)
            if ok.all():
                keep = np.ones(len(data), bool)
                keep[head_at] = False
                return data[keep].view(dtype)
            ok = np.logical_and.reduceat(ok, np.cumsum(head_lens) - head_lens)
        k = int(np.flatnonzero(~ok)[0])
        raise DataError(f"token shard {self.path} record {int(records[k])} is not the "
                        f"{int(sizes[k]) // dtype.itemsize} token ids its index says: prepare the dataset again")


class ShardedTokens:
    """The token stream [lo, hi) of a token dataset: len(), slices (views), windows, documents."""

    def __init__(self, folder, files: Sequence[str], counts: Sequence[int], documents: Sequence[int], dtype,
                 lo: int = 0, hi: int | None = None, _opened: dict | None = None,
                 _lock: threading.Lock | None = None):
        self.folder = storage.path(folder)
        self.files = list(files)
        self.counts = np.asarray(counts, np.int64)
        self.documents = np.asarray(documents, np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)])   # shard s holds [starts[s], starts[s+1])
        self.dtype = np.dtype(dtype)
        self.lo, self.hi = lo, int(self.starts[-1]) if hi is None else hi
        self._opened = {} if _opened is None else _opened             # shared by views: one reader per shard
        self._lock = threading.Lock() if _lock is None else _lock

    @classmethod
    def open(cls, folder, expect_tokenizer: str | None = None, tokenizer_name: str = "") -> "ShardedTokens":
        """The token dataset in `folder`, its manifest and shard sizes checked; with
        `expect_tokenizer`, refused when made by another tokenizer. `folder` may be gs://: its
        manifest and shard sizes are checked there (storage.py)."""
        folder = storage.path(folder)
        manifest = read_manifest(folder)
        if expect_tokenizer is not None and manifest.get("tokenizer") != expect_tokenizer:
            raise DataError(f"token dataset {folder} was tokenized by tokenizer {manifest.get('tokenizer')} "
                            f"(its {MANIFEST}) but {tokenizer_name or 'the tokenizer given'} is "
                            f"{expect_tokenizer}: use its own tokenizer.json or prepare it again")
        for shard in manifest["shards"]:
            path = folder / shard["file"]
            size = storage.size(path)
            if size != shard["bytes"] or storage.size(folder / index_file(shard["file"])) is None:
                state = ("is missing" if size is None else f"has {size:,} bytes, not {shard['bytes']:,}"
                         if size != shard["bytes"] else f"has no index {index_file(shard['file'])}")
                raise DataError(f"token shard {path} {state}: prepare the dataset again (a rerun "
                                f"redoes only the missing shards once {folder / MANIFEST} is deleted)")
        shards = manifest["shards"]
        return cls(folder, [s["file"] for s in shards], [s["tokens"] for s in shards],
                   [s["documents"] for s in shards], manifest["dtype"])

    def __getstate__(self):   # readers stay behind: a copy (a worker process) reopens what it reads
        return dict(self.__dict__, _opened={}, _lock=None)

    def __setstate__(self, state):
        self.__dict__.update(state, _lock=threading.Lock())

    def __len__(self) -> int:
        return self.hi - self.lo

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def _shard(self, s: int) -> _Shard:
        """Shard s's reader (opened on first use, then kept)."""
        shard = self._opened.get(s)
        if shard is None:
            with self._lock:
                if s not in self._opened:
                    self._opened[s] = _Shard(self.folder / self.files[s], int(self.documents[s]))
                shard = self._opened[s]
        return shard

    def opened_shards(self) -> list[int]:
        return sorted(self._opened)

    def _pieces(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """Absolute positions [start, stop) as (shard, offset in shard, length) pieces."""
        s = int(np.searchsorted(self.starts, start, side="right")) - 1
        pieces = []
        while start < stop:
            end = min(stop, int(self.starts[s + 1]))
            if end > start:   # an empty shard is never opened
                pieces.append((s, start - int(self.starts[s]), end - start))
            start, s = end, s + 1
        return pieces

    def _read(self, spans: Sequence[tuple[int, int]]) -> list[np.ndarray]:
        """The tokens of each absolute span [start, stop), reading each shard once for them all."""
        pieces = [self._pieces(a, b) for a, b in spans]
        by_shard: dict[int, list] = {}
        for row, row_pieces in enumerate(pieces):
            for j, (s, offset, length) in enumerate(row_pieces):
                by_shard.setdefault(s, []).append((row, j, offset, length))
        parts = [[None] * len(p) for p in pieces]
        for s, items in by_shard.items():
            shard = self._shard(s)
            offsets = np.array([item[2] for item in items], np.int64)
            lengths = np.array([item[3] for item in items], np.int64)
            first = np.searchsorted(shard.ends, offsets, side="right")            # (shard, record, offset)
            last = np.searchsorted(shard.ends, offsets + lengths - 1, side="right")
            records = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first.tolist(), last.tolist())]))
            tokens = shard.read(records, self.dtype)
            at = np.concatenate([[0], np.cumsum(shard.ends[records] - shard.starts(records))])
            # A piece's records are consecutive, and so are their tokens in `tokens`.
            begins = at[np.searchsorted(records, first)] + offsets - shard.starts(first)
            for (row, j, _, length), begin in zip(items, begins.tolist()):
                parts[row][j] = tokens[begin:begin + length]
        return [p[0] if len(p) == 1 else np.concatenate(p) if p else np.zeros(0, self.dtype) for p in parts]

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return np.asarray(self)[key]
            stop = max(start, stop)
            return ShardedTokens(self.folder, self.files, self.counts, self.documents, self.dtype,
                                 self.lo + start, self.lo + stop, self._opened, self._lock)
        i = int(key) + (len(self) if int(key) < 0 else 0)
        if not 0 <= i < len(self):
            raise IndexError(key)
        return self._read([(self.lo + i, self.lo + i + 1)])[0][0]

    def __array__(self, dtype=None, copy=None):
        flat = self._read([(self.lo, self.hi)])[0]
        return np.asarray(flat, dtype) if dtype is not None else np.asarray(flat)

    def tolist(self) -> list[int]:
        return np.asarray(self).tolist()

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """int32 [len(starts), length]: the tokens at [start, start + length) of each start."""
        starts = np.asarray(starts, np.int64) + self.lo
        out = np.empty((len(starts), length), np.int32)
        for row, tokens in enumerate(self._read([(a, a + length) for a in starts.tolist()])):
            out[row] = tokens
        return out

    def document_ends(self, s: int) -> np.ndarray:
        """int64 end offsets of shard s's documents (records), within the shard (its index)."""
        return np.asarray(self._shard(s).ends)

    def shard_documents(self, s: int) -> list[np.ndarray]:
        """Shard s's documents (records), each its ids with end-of-text."""
        shard = self._shard(s)
        records = np.arange(int(self.documents[s]))
        tokens = shard.read(records, self.dtype)
        return np.split(tokens, np.asarray(shard.ends[:-1])) if len(records) else []
