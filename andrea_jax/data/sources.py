"""`data.source` -> a prepared dataset: random access to documents (records with a `text` field).

embedded: the shipped tinyshakespeare file; files: local .txt / .jsonl files; both go through the
project's TFDS builder (tfds_builder.py) into `array_record`. tfds: a registered TFDS dataset read
with `as_data_source`, prepared in array_record format beforehand or downloaded here.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Sequence

import tensorflow_datasets as tfds

from andrea_jax.data import documents, tfds_builder
from andrea_jax.errors import DataError

EMBEDDED_CORPUS = pathlib.Path(__file__).resolve().parent / "tinyshakespeare.txt"
RANDOM_ACCESS_FORMATS = ("array_record", "parquet")


@dataclasses.dataclass(frozen=True)
class Source:
    name: str                     # names the data in messages: a file, a path or glob, a TFDS dataset
    dataset_dir: pathlib.Path     # the prepared dataset; token caches are written beside it
    train: Sequence               # records {'text': bytes | str}, random access, in document order
    val: Sequence | None          # a separate validation split, or None: hold out the tail of train


def open_source(data_cfg, cache_dir: pathlib.Path) -> Source:
    """Opens (building or checking first) the dataset that `data_cfg` (a DataConfig) names."""
    if data_cfg.source in ("embedded", "files"):
        pattern = str(EMBEDDED_CORPUS) if data_cfg.source == "embedded" else data_cfg.path
        files = documents.find_files(pattern)
        builder = tfds_builder.build(files, data_cfg.data_dir or cache_dir / "tfds")
        name = str(files[0]) if len(files) == 1 else f"{pattern} ({len(files)} files)"
        return Source(name, pathlib.Path(builder.data_dir), builder.as_data_source(split="train"), None)
    if data_cfg.source == "tfds":
        return open_tfds(data_cfg.tfds_name, data_cfg.tfds_split, data_cfg.tfds_val_split,
                         data_cfg.data_dir or None, data_cfg.tfds_download)
    raise DataError(f"unknown data.source {data_cfg.source!r}")


def _how_to_prepare(name: str, root: str) -> str:
    return (f"prepare it where there is network with `tfds build {name} --data_dir {root} "
            f"--file_format array_record` (or copy a prepared copy there) and set data.data_dir={root}")


def open_tfds(name: str, split: str, val_split: str, data_dir: str | None, download: bool) -> Source:
    """A registered TFDS dataset: prepared in `data_dir`, or downloaded when `download` is on."""
    root = data_dir or str(tfds.core.constants.DATA_DIR)
    try:
        builder = tfds.builder(name, data_dir=data_dir, file_format="array_record")
    except tfds.core.registered.DatasetNotFoundError:
        raise DataError(f"TFDS dataset {name!r} has no builder here and no prepared copy in data_dir "
                        f"{root}: {_how_to_prepare(name, root)}") from None
    root = str(getattr(builder, "_data_dir_root", root))
    if not builder.is_prepared():
        problem = "data.tfds_download is off"
        if download:
            try:
                builder.download_and_prepare()
            except Exception as e:  # no network, a missing extra, a manual download: all say the same
                problem = f"downloading it failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        if not builder.is_prepared():
            raise DataError(f"TFDS dataset {name!r} is not prepared in data_dir {root} (looked in "
                            f"{builder.data_dir}) and {problem}: {_how_to_prepare(name, root)}")
    file_format = str(getattr(builder.info.file_format, "value", builder.info.file_format))
    if file_format not in RANDOM_ACCESS_FORMATS:
        raise DataError(f"TFDS dataset {name!r} in {builder.data_dir} is stored as {file_format}, which has "
                        f"no random access: rebuild it with `--file_format array_record`")
    if "text" not in builder.info.features:
        raise DataError(f"TFDS dataset {name!r} has no 'text' feature (it has: "
                        f"{', '.join(builder.info.features)}); only text datasets can be trained on")

    def split_source(key: str, value: str):
        try:
            return builder.as_data_source(split=value)
        except (ValueError, KeyError) as e:
            raise DataError(f"data.{key} {value!r}: not a split of TFDS dataset {name!r} (splits: "
                            f"{', '.join(builder.info.splits)}; {str(e).splitlines()[0]})") from None

    val = split_source("tfds_val_split", val_split) if val_split else None
    return Source(f"tfds {name} {split}", pathlib.Path(builder.data_dir),
                  split_source("tfds_split", split), val)
