"""Writing the token format of andrea_jax.data.token_shards: one shard (records, index, marker),
TFDS's metadata and the manifest, each file written whole (storage.py: a local file under a
temporary name and renamed, an object in one upload), so a reader never sees a half-written one.
Into a gs:// folder, a shard and its index are written locally first and then uploaded:
array_record's writer cannot write to an object store. The pretokenize cache (andrea_jax.data.token_cache) and the
Beam preparation (andrea_jax.data.prepare.driver) write through here.
"""
from __future__ import annotations

import io
import json
import os
import pathlib
import tempfile
import time
from typing import Iterable, Sequence

import numpy as np

from andrea_jax.data import storage
from andrea_jax.data.token_shards import (DATASET, FEATURE, FORMAT, MANIFEST, SPLIT, WRITER_OPTIONS,
                                          index_file, marker_file, record_header)

def atomic_write_bytes(path, data: bytes) -> None:
    storage.write_bytes(storage.path(path), data)


def atomic_write_json(path, value) -> None:
    atomic_write_bytes(path, json.dumps(value, indent=1).encode())


def load_index(path) -> np.ndarray:
    """A shard's index (int64 document end offsets), read whole from its bytes: an object in a
    bucket cannot be memory-mapped, and an index is 8 bytes a document."""
    return np.load(io.BytesIO(storage.path(path).read_bytes()), allow_pickle=False)


def encode_record(ids: np.ndarray) -> bytes:
    raw = np.ascontiguousarray(ids).tobytes()
    return record_header(len(raw)) + raw


def tfds_features(dtype):
    import tensorflow_datasets as tfds

    return tfds.features.FeaturesDict({FEATURE: tfds.features.Tensor(
        shape=(None,), dtype=np.dtype(dtype).type, encoding=tfds.features.Encoding.BYTES)})



def write_shard(folder, name: str, id_batches: Iterable, dtype: np.dtype, label: dict) -> dict:
    """Streams (ids, document lengths) batches into shard `name`, one record per document, and its
    index; the marker, written last and whole, says the shard is complete and what made it
    (`label`). Into a gs:// folder the files are made in a local temporary folder, then uploaded."""
    folder = storage.path(folder)
    if not storage.is_remote(folder):
        return _write_shard_files(folder, folder, name, id_batches, dtype, label)
    with tempfile.TemporaryDirectory(prefix="andrea-shard-") as local:
        return _write_shard_files(pathlib.Path(local), folder, name, id_batches, dtype, label)


def _write_shard_files(local: pathlib.Path, folder, name: str, id_batches: Iterable, dtype, label: dict) -> dict:
    from array_record.python import array_record_module

    dtype = np.dtype(dtype)
    path, idx_path = local / name, local / index_file(name)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp_idx = idx_path.with_name(idx_path.name + f".tmp{os.getpid()}.npy")
    ends, n_tokens = [], 0
    start, cpu_start, started = time.perf_counter(), time.process_time(), time.time()
    writer = array_record_module.ArrayRecordWriter(str(tmp), WRITER_OPTIONS)
    try:
        for ids, lengths in id_batches:
            ids = np.asarray(ids, dtype)
            doc_ends = np.cumsum(lengths, dtype=np.int64)
            for a, b in zip([0, *doc_ends[:-1].tolist()], doc_ends.tolist()):
                writer.write(encode_record(ids[a:b]))
            ends.append(n_tokens + doc_ends)
            n_tokens += len(ids)
    finally:
        writer.close()
    ends = np.concatenate(ends) if ends else np.zeros(0, np.int64)
    np.save(tmp_idx, ends)
    os.replace(tmp, path)
    os.replace(tmp_idx, idx_path)
    n_bytes = path.stat().st_size
    if folder is not local:   # an object store: each file one upload, the marker after both
        storage.upload(path, folder / name)
        storage.upload(idx_path, folder / index_file(name))
    # What it took to make, and where (benchmarks/data.py reads it): not part of the format.
    made = {"seconds": round(time.perf_counter() - start, 3), "cpu_seconds": round(time.process_time() - cpu_start, 3),
            "started": started, "finished": time.time(), "pid": os.getpid()}
    marker = dict(label, file=name, tokens=n_tokens, documents=len(ends), dtype=dtype.name,
                  bytes=n_bytes, made=made)
    atomic_write_json(folder / marker_file(name), marker)
    return marker


def complete_shard(folder, name: str, label: dict) -> dict | None:
    """The marker of shard `name` when it is complete, made with `label` and its files intact; else None."""
    folder = storage.path(folder)
    try:
        marker = json.loads((folder / marker_file(name)).read_text())
        ok = (all(marker.get(k) == v for k, v in label.items())
              and storage.size(folder / name) == marker["bytes"]
              and load_index(folder / index_file(name)).shape == (marker["documents"],))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return marker if ok else None


def write_tfds_metadata(folder, markers: Sequence[dict], dtype, tokenizer: str,
                        description: str) -> None:
    """dataset_info.json and features.json: what `tfds.builder_from_directory` reads."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core import dataset_info, naming, splits as splits_lib

    folder = storage.path(folder)
    identity = dataset_info.DatasetIdentity(name=DATASET, version=tfds.core.Version("1.0.0"), data_dir=str(folder),
                                            module_name="", config_name=tokenizer or "untokenized")
    info = dataset_info.DatasetInfo(builder=identity, features=tfds_features(dtype), disable_shuffling=True,
                                    description=description)
    info.set_file_format("array_record")
    template = naming.ShardedFileTemplate(data_dir=folder, template=naming.DEFAULT_FILENAME_TEMPLATE,
                                          dataset_name=DATASET, split=SPLIT, filetype_suffix="array_record")
    split = splits_lib.SplitInfo(name=SPLIT, shard_lengths=[m["documents"] for m in markers],
                                 num_bytes=sum(m["bytes"] for m in markers), filename_template=template)
    info.set_splits(splits_lib.SplitDict([split]))
    info.write_to_directory(folder)


def write_manifest(folder, markers: Sequence[dict], **meta) -> dict:
    """TFDS's metadata, then the manifest (last: its presence says the dataset is complete)."""
    markers = sorted(markers, key=lambda m: m["file"])
    dtype = markers[0]["dtype"] if markers else "uint16"
    write_tfds_metadata(folder, markers, dtype, meta.get("tokenizer", ""),
                        f"Token ids of {meta.get('source', 'a corpus')}, one record per document (ANDREA-JAX).")
    manifest = dict(meta, format=FORMAT, dtype=dtype,
                    tokens=sum(m["tokens"] for m in markers), documents=sum(m["documents"] for m in markers),
                    shards=[{"file": m["file"], "tokens": m["tokens"], "documents": m["documents"],
                             "bytes": m["bytes"]} for m in markers])
    atomic_write_json(storage.path(folder) / MANIFEST, manifest)
    return manifest
