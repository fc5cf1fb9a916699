"""The project's TFDS builder for local text files, written as `array_record` with no TensorFlow.

The dataset's config name is a hash of the files' paths, sizes and modification times, so a changed
corpus builds a new dataset beside the old one and an unchanged one is never rebuilt. Documents keep
file order (shuffling is the loader's job), one `text` feature each.
"""
from __future__ import annotations

import hashlib
import logging
import pathlib
from typing import Sequence

import tensorflow_datasets as tfds

from andrea_jax.data import documents, storage
from andrea_jax.errors import DataError


_PACKAGE = pathlib.Path(__file__).resolve().parents[1]


def _stamp(path) -> str:
    """What identifies a file: its path, size and time (cheap at any size), or, for a file shipped
    in the package (the embedded corpus), its name in the package and its bytes' hash, so that a
    dataset, and a checkpoint's data state, is the same in every checkout and install."""
    if not str(path).startswith("gs://") and pathlib.Path(path).resolve().is_relative_to(_PACKAGE):
        local = pathlib.Path(path).resolve()
        return f"andrea_jax/{local.relative_to(_PACKAGE)}\0{hashlib.sha256(local.read_bytes()).hexdigest()}"
    size, mtime_ns = storage.stamp(path)   # a local file or a gs:// object (prepare --path)
    return f"{path}\0{size}\0{mtime_ns}"


def files_key(files: Sequence[pathlib.Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{_stamp(path)}\n".encode())
    return digest.hexdigest()[:16]


class _LocalDatasetInfo(tfds.core.DatasetInfo):
    """A dataset built here is never in TFDS's public bucket; TFDS's lookup of it there, at every build,
    would leave an empty temporary folder behind."""

    def initialize_from_bucket(self) -> None:
        return None


class AndreaTextFiles(tfds.core.GeneratorBasedBuilder):
    """Documents of local .txt / .jsonl files, in one `train` split."""

    VERSION = tfds.core.Version("1.0.0")

    def __init__(self, *, files: Sequence[pathlib.Path], **kwargs):
        self._files = list(files)
        super().__init__(**kwargs)
        # TFDS pickles a builder (and its data sources, which grain's workers receive) as its
        # constructor's arguments: ours include the files.
        self._original_state = dict(self._original_state, files=self._files)

    # Nothing to download, so no checksums file to look up: that lookup needs importlib_resources,
    # which TFDS 4.9 uses but does not declare on Python >= 3.9 (tensorflow/datasets#11212).
    @tfds.core.utils.classproperty
    @classmethod
    def url_infos(cls):
        return None

    def _log_download_bytes(self) -> None:  # TFDS's own lines speak of downloads and unknown sizes
        print(f"data: building TFDS dataset {self.name}/{self.builder_config.name} from "
              f"{len(self._files)} file(s) in {self.data_dir}", flush=True)

    def _log_download_done(self) -> None:
        print(f"data: built {self.info.splits['train'].num_examples:,} document(s)", flush=True)

    def _info(self) -> tfds.core.DatasetInfo:
        return _LocalDatasetInfo(
            builder=self, description="Documents of local .txt / .jsonl files (ANDREA-JAX).",
            features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
            disable_shuffling=True)

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        n = 0
        for i, path in enumerate(self._files):
            for j, text in enumerate(documents.read_documents(path)):
                yield f"{i:08d}-{j:010d}", {"text": text}
                n += 1
        if n == 0:
            where = f"corpus file {self._files[0]}" if len(self._files) == 1 else \
                f"corpus of {len(self._files)} files ({self._files[0]}, ...)"
            raise DataError(f"{where} is empty")


def build(files: Sequence[pathlib.Path], data_dir: str | pathlib.Path) -> AndreaTextFiles:
    """The prepared dataset of `files` under `data_dir`, built on first use."""
    config = tfds.core.BuilderConfig(name=files_key(files), description=f"{len(files)} files from {files[0]}")
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)  # TFDS warns of every custom config and not-yet-built folder
    try:
        builder = AndreaTextFiles(files=files, config=config, data_dir=str(data_dir), file_format="array_record")
        if not builder.is_prepared():
            tfds.display_progress_bar(False)
            builder.download_and_prepare()
    finally:
        absl_logger.setLevel(level)
    return builder
