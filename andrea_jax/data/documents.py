"""The one reader of documents, for training and for the preparation alike.

Files: a `.txt` file is one document; each line of a JSON-lines file (`.jsonl`, `.json`, either
gzipped) one, its `text`; each row of a `.parquet` file one, its `text` column. Records of a
prepared dataset: their `text` (`record_texts`). Every bad input stops with a DataError naming the
file (and line); invalid UTF-8 is decoded with U+FFFD and counted in one DataWarning per file,
never a crash.
"""
from __future__ import annotations

import contextlib
import glob
import gzip
import json
import pathlib
import warnings
from typing import Iterator, Sequence

from andrea_jax.errors import DataError, DataWarning

SUFFIXES = (".txt", ".jsonl")   # what data.path reads; the preparation's --path reads more
READ_RECORDS = 512               # records fetched from a dataset per read
_REPLACEMENT_UTF8 = "\ufffd".encode()


def find_files(pattern: str, setting: str = "data.path") -> list[pathlib.Path]:
    """The sorted .txt / .jsonl files named by a file, a folder (read recursively) or a glob, local
    or gs:// (storage.py); `setting` names the pattern in errors (data.path, prepare's --path)."""
    from andrea_jax.data import storage

    path = storage.path(pattern, setting)
    if storage.is_remote(path):
        return storage.find_files(pattern, tuple(SUFFIXES), setting, ".txt or .jsonl")
    path = path.expanduser()
    if any(c in pattern for c in "*?["):
        files = sorted(p for p in map(pathlib.Path, glob.glob(str(path), recursive=True)) if p.is_file())
        if not files:
            raise DataError(f"{setting} {pattern!r} matches no files")
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        if not files:
            raise DataError(f"folder {path} holds no .txt or .jsonl files")
    elif path.is_file():
        files = [path]
    else:
        raise DataError(f"{setting} {pattern!r}: no such file or folder")
    for p in files:
        if p.suffix not in SUFFIXES:
            raise DataError(f"{p}: not a .txt or .jsonl file")
    return [p.resolve() for p in files]


def decode(data: bytes) -> tuple[str, int]:
    """UTF-8 text with invalid sequences replaced by U+FFFD, and how many were replaced."""
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        return text, text.count("\ufffd") - data.count(_REPLACEMENT_UTF8)


def _check_not_binary(path: pathlib.Path, chunk: bytes, offset: int) -> None:
    nul = chunk.find(b"\0")
    if nul >= 0:
        raise DataError(f"{path} is a binary file (NUL byte at offset {offset + nul}); "
                        f"only UTF-8 .txt and .jsonl files are read")


def _jsonl_text(path: pathlib.Path, lineno: int, line: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{path} line {lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(record, dict) or "text" not in record:
        keys = ", ".join(map(str, record)) if isinstance(record, dict) else type(record).__name__
        raise DataError(f"{path} line {lineno}: the record has no 'text' field (it has: {keys or 'nothing'})")
    if not isinstance(record["text"], str):
        raise DataError(f"{path} line {lineno}: 'text' is a {type(record['text']).__name__}, not a string")
    return record["text"]


def _json_lines(path, lines, replaced: list[int]) -> Iterator[str]:
    """The non-blank `text` fields of a JSON-lines file's lines; adds the invalid UTF-8 sequences
    replaced to replaced[0]."""
    offset = 0
    for lineno, raw in enumerate(lines, 1):
        _check_not_binary(path, raw, offset)
        offset += len(raw)
        line, bad = decode(raw)
        replaced[0] += bad
        if line.strip():
            text = _jsonl_text(path, lineno, line)
            if text.strip():
                yield text


def _parquet_documents(path) -> Iterator[str]:
    """The non-blank `text` column of a parquet file (C4, FineWeb, ...)."""
    import pyarrow.parquet as pq

    from andrea_jax.data import storage

    try:
        table = pq.ParquetFile(storage.open_binary(path))
        if "text" not in table.schema_arrow.names:
            raise DataError(f"{path}: no 'text' column (it has: {', '.join(table.schema_arrow.names)})")
        for batch in table.iter_batches(columns=["text"], batch_size=4096):
            for text in batch.column(0).to_pylist():
                if text and text.strip():
                    yield text
    except DataError:
        raise
    except Exception as e:  # pyarrow's errors: a truncated or non-parquet file
        raise DataError(f"{path}: unreadable parquet file ({type(e).__name__}: {str(e).splitlines()[0]})") from None


def read_documents(path) -> Iterator[str]:
    """The non-blank documents of one file (a local path or a gs:// object), in file order."""
    if path.name.endswith(".parquet"):
        yield from _parquet_documents(path)
        return
    replaced = [0]
    if path.suffix == ".txt":
        data = path.read_bytes()
        _check_not_binary(path, data, 0)
        text, replaced[0] = decode(data)
        if text.strip():
            yield text
    else:
        try:
            with path.open("rb") as file, (gzip.open(file, "rb") if path.name.endswith(".gz")
                                          else contextlib.nullcontext(file)) as lines:
                yield from _json_lines(path, lines, replaced)
        except (OSError, EOFError) as e:  # gzip: a truncated download or not gzip at all
            raise DataError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    if replaced[0]:
        warnings.warn(f"{path}: {replaced[0]} invalid UTF-8 sequence(s) replaced by U+FFFD", DataWarning,
                      stacklevel=2)


def record_texts(records: Sequence) -> Iterator[str]:
    """The `text` of a dataset's records in order."""
    read_many = getattr(records, "__getitems__", lambda ids: [records[i] for i in ids])
    for start in range(0, len(records), READ_RECORDS):
        for record in read_many(range(start, min(start + READ_RECORDS, len(records)))):
            text = record["text"]
            text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
            yield text
