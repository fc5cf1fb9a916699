"""Local text files -> documents: a `.txt` file is one document, each `.jsonl` line one (its `text`).

Every bad input stops with a DataError naming the file (and line); invalid UTF-8 is decoded with
U+FFFD and counted in one DataWarning per file, never a crash.
"""
from __future__ import annotations

import glob
import json
import pathlib
import warnings
from typing import Iterator

from andrea_jax.errors import DataError, DataWarning

SUFFIXES = (".txt", ".jsonl")
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


def read_documents(path: pathlib.Path) -> Iterator[str]:
    """The non-blank documents of one file, in file order."""
    replaced = 0
    if path.suffix == ".txt":
        data = path.read_bytes()
        _check_not_binary(path, data, 0)
        text, replaced = decode(data)
        if text.strip():
            yield text
    else:
        offset = 0
        with path.open("rb") as f:
            for lineno, raw in enumerate(f, 1):
                _check_not_binary(path, raw, offset)
                offset += len(raw)
                line, bad = decode(raw)
                replaced += bad
                if line.strip():
                    text = _jsonl_text(path, lineno, line)
                    if text.strip():
                        yield text
    if replaced:
        warnings.warn(f"{path}: {replaced} invalid UTF-8 sequence(s) replaced by U+FFFD", DataWarning,
                      stacklevel=2)
