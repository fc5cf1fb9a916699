"""Paths of the data tools that may name an object store: a local path stays a `pathlib.Path`, a
`gs://BUCKET/PATH` URL becomes an `etils.epath.Path` (its fsspec backend, gcsfs: the `gcs` extra),
and any other URL is refused with one line. `pathlib` cannot hold a URL (it turns `gs://b` into
`gs:/b`), so every prepare, token_shards and training path goes through `path()` here.

Writes are whole or not at all, so that a reader never sees a half-written file: a local file is
written under a temporary name and renamed; an object is one upload (GCS makes an object visible
only once its upload is complete, and has no rename).
"""
from __future__ import annotations

import os
import pathlib
import shutil

from andrea_jax.errors import DataError, MissingExtraError, is_missing

SUPPORTED = "local paths and gs://BUCKET/PATH"
_COPY_CHUNK = 16 << 20


def path(p, what: str = "path"):
    """`p` (a str or a path) as a pathlib.Path, or an epath.Path for gs://; `what` names the
    setting in the message refusing another URL scheme (s3://, ...)."""
    text = os.fspath(p)
    if "://" not in text:
        return p if isinstance(p, pathlib.Path) else pathlib.Path(text)
    scheme = text.split("://", 1)[0]
    if scheme != "gs":
        raise DataError(f"{what} {text}: {scheme}:// is not supported, only {SUPPORTED}")
    try:  # here, not at epath's first access, which fails deep inside fsspec
        import gcsfs  # noqa: F401
    except ImportError as err:
        if not is_missing(err, "gcsfs"):
            raise
        raise MissingExtraError(f"{what} {text}", "gcs") from None
    from etils import epath

    return epath.Path(text)


def is_remote(p) -> bool:
    return os.fspath(p).startswith("gs://")


def size(p) -> int | None:
    """The file's size in bytes; None when there is no such file."""
    try:
        if is_remote(p):
            return None if p.is_dir() else p.stat().length
        return p.stat().st_size if p.is_file() else None
    except FileNotFoundError:
        return None


def write_bytes(p, data: bytes) -> None:
    """The file `p` made `data`, whole or not at all (a rename; an object's single upload)."""
    if is_remote(p):
        p.write_bytes(data)
        refresh(p)
        return
    tmp = p.with_name(p.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, p)


def upload(local: pathlib.Path, dest) -> None:
    """A local file copied to the object `dest` in one upload (streamed: a shard may be GBs)."""
    with open(local, "rb") as src, dest.open("wb") as dst:
        shutil.copyfileobj(src, dst, _COPY_CHUNK)
    refresh(dest)


def download(src, local: pathlib.Path) -> None:
    """The object `src` copied to the local file `local`, renamed into place once complete."""
    tmp = local.with_name(local.name + f".tmp{os.getpid()}")
    with src.open("rb") as f, open(tmp, "wb") as dst:
        shutil.copyfileobj(f, dst, _COPY_CHUNK)
    os.replace(tmp, local)


def refresh(p) -> None:
    """Forgets gcsfs's cached listings, which do not see what other processes (the pipeline's
    workers) wrote since; nothing for a local path."""
    if is_remote(p):
        from etils.epath import backend

        backend.fsspec_backend.fs(os.fspath(p)).invalidate_cache()


def stamp(p) -> tuple[int, int]:
    """(size, modification time in ns) of a file or object: what says that it changed."""
    st = p.stat()
    if is_remote(p):
        return st.length, int(st.mtime) * 10**9
    return st.st_size, st.st_mtime_ns


def find(pattern: str, suffixes: tuple[str, ...]) -> list:
    """The sorted objects named by a gs:// URL: those a glob matches, the object itself, or those
    ending in `suffixes` under it read as a folder (a prefix); [] when it names nothing."""
    from etils import epath
    from etils.epath import backend

    fs = backend.fsspec_backend.fs(pattern)
    if any(c in pattern for c in "*?["):
        names = [n for n in fs.glob(pattern) if fs.isfile(n)]
    elif fs.isfile(pattern):
        names = [pattern]
    else:
        names = [n for n in fs.find(pattern) if n.endswith(suffixes)]
    return sorted(epath.Path("gs://" + n.removeprefix("gs://")) for n in names)


def find_files(pattern: str, suffixes: tuple[str, ...], setting: str, kinds: str) -> list:
    """find(), refusing a URL that names nothing, or a matched object of another kind, with one line
    naming `setting` (e.g. --path) and the `kinds` wanted (e.g. ".txt or .jsonl")."""
    files = find(pattern, suffixes)
    if not files:
        raise DataError(f"{setting} {pattern!r} names no {kinds} files")
    for p in files:
        if not p.name.endswith(suffixes):
            raise DataError(f"{p}: not a {kinds} file")
    return files


def open_binary(p):
    """A local path as it is (the readers open it), an object as an open binary file."""
    return p.open("rb") if is_remote(p) else p
