"""The input of `python -m andrea_jax.data.prepare`: a corpus cut into units (a file; a range of TFDS
records), in corpus order, and the units into K shards of about equal size. The driver plans
(`plan_units`, `assign_shards`); the workers read a unit's documents (`unit_documents`).
"""
from __future__ import annotations

import os
import pathlib
from typing import Iterator, Sequence

import numpy as np

from andrea_jax.data import documents, sampling, storage
from andrea_jax.errors import DataError

HF_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")

def _hf_files(pattern: str) -> list[pathlib.Path]:
    """The sorted JSON-lines (optionally gzipped) and parquet files named by a file, folder or glob,
    local or gs:// (storage.py)."""
    import glob

    path = storage.path(pattern, "--path")
    if storage.is_remote(path):
        return storage.find_files(pattern, HF_SUFFIXES, "--path", ", ".join(HF_SUFFIXES))
    path = path.expanduser()
    if any(c in pattern for c in "*?["):
        files = sorted(pathlib.Path(p) for p in glob.glob(str(path), recursive=True) if os.path.isfile(p))
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(HF_SUFFIXES))
    elif path.is_file():
        files = [path]
    else:
        raise DataError(f"--path {pattern!r}: no such file or folder")
    if not files:
        raise DataError(f"--path {pattern!r} names no {', '.join(HF_SUFFIXES)} files")
    for p in files:
        if not p.name.endswith(HF_SUFFIXES):
            raise DataError(f"{p}: not one of {', '.join(HF_SUFFIXES)}")
    return [p.resolve() for p in files]


_TFDS_SOURCES: dict = {}


def _tfds_records(name: str, split: str, data_dir: str | None):
    """The split's records: of a registered dataset, or of any prepared one in data_dir (read by its
    dataset_info.json alone, so that workers need not import the code that registered it)."""
    key = (name, split, data_dir)
    if key not in _TFDS_SOURCES:
        from andrea_jax.data import sources

        try:
            _TFDS_SOURCES[key] = sources.open_tfds(name, split, "", data_dir, download=False).train
        except DataError:
            infos = sorted(pathlib.Path(data_dir, name).glob("**/dataset_info.json")) if data_dir else []
            if not infos:
                raise
            import tensorflow_datasets as tfds

            _TFDS_SOURCES[key] = tfds.builder_from_directory(str(infos[-1].parent)).as_data_source(split=split)
    return _TFDS_SOURCES[key]


def unit_documents(unit: tuple) -> Iterator[str]:
    """The documents of one unit, in order: ("files", path), ("hf-jsonl", path), ("tfds", name, split,
    data_dir, lo, hi)."""
    kind = unit[0]
    if kind in ("files", "hf-jsonl"):
        return documents.read_documents(storage.path(unit[1]))
    _, name, split, data_dir, lo, hi = unit
    records = _tfds_records(name, split, data_dir)
    return documents.record_texts(sampling._Subset(records, range(lo, hi)))


def plan_units(args) -> tuple[list[tuple], list[int], str, str]:
    """(units, their sizes, a key of the input's identity, a name for messages)."""
    if args.source in ("files", "hf-jsonl"):
        if not args.path:
            raise DataError(f"--source {args.source} needs --path (a folder, file or glob)")
        files = documents.find_files(args.path, "--path") if args.source == "files" else _hf_files(args.path)
        from andrea_jax.data.tfds_builder import files_key

        name = str(files[0]) if len(files) == 1 else f"{args.path} ({len(files)} files)"
        return [(args.source, str(p)) for p in files], [storage.stamp(p)[0] for p in files], \
            f"{args.source}-{files_key(files)}", name
    if not args.name:
        raise DataError("--source tfds needs --name (a TFDS dataset prepared in array_record format)")
    n = len(_tfds_records(args.name, args.split, args.data_dir))
    pieces = max(args.shards * 4, 1)
    bounds = [n * i // pieces for i in range(pieces + 1)]
    units = [("tfds", args.name, args.split, args.data_dir, lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]
    return units, [hi - lo for *_, lo, hi in units], f"tfds-{args.name}-{args.split}-{n}".replace("/", "_"), \
        f"tfds {args.name} {args.split}"


def assign_shards(sizes: Sequence[int], k: int) -> list[list[int]]:
    """Units (in order) cut into k contiguous groups of about equal total size: each cut at the unit
    boundary nearest to its share of the total."""
    cum = np.cumsum([0, *sizes], dtype=np.float64)
    cuts = [0]
    for target in cum[-1] * np.arange(1, k) / k:
        j = int(np.searchsorted(cum, target))
        j = j - 1 if j == len(cum) or (j > 0 and target - cum[j - 1] <= cum[j] - target) else j
        cuts.append(max(cuts[-1], j))
    cuts.append(len(sizes))
    return [list(range(cuts[i], cuts[i + 1])) for i in range(k)]

