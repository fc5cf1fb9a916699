"""A prepared token dataset in a bucket (data.path=gs://...), copied once into a local cache folder
that training reads.

Why a copy: array_record's reader opens gs:// through its own C++ GCS client, which does not honour
STORAGE_EMULATOR_HOST (against an emulator it waits forever), and training reads random windows,
a small read per record: from local disk, not a request each. The copy is
CACHE/prepared/HASH, HASH of the dataset's URL and its manifest's bytes, so a dataset prepared again
(a new manifest) is copied again, and an unchanged one never. Its manifest is written last: a
folder with one is complete, and a copy interrupted before is redone.
"""
from __future__ import annotations

import hashlib
import pathlib

from andrea_jax.data import storage, token_shards

# Besides the shards and their indexes: what the training run and TFDS read.
_METADATA = ("tokenizer.json", "dataset_info.json", "features.json")


def local_copy(folder, cache_dir: pathlib.Path) -> pathlib.Path:
    """The local folder holding the files of the gs:// token dataset `folder`; copies them the
    first time (the caller holds the cache's build lock)."""
    manifest = token_shards.read_manifest(folder)   # none, or another format: its DataError
    manifest_bytes = (folder / token_shards.MANIFEST).read_bytes()
    digest = hashlib.sha256(str(folder).encode() + b"\0" + manifest_bytes).hexdigest()[:16]
    local = pathlib.Path(cache_dir) / "prepared" / digest
    if (local / token_shards.MANIFEST).is_file():
        return local
    token_shards.ShardedTokens.open(folder)   # a shard missing or cut short there: its DataError
    local.mkdir(parents=True, exist_ok=True)
    files = [name for shard in manifest["shards"] for name in (shard["file"], token_shards.index_file(shard["file"]))]
    print(f"data: copying {len(files) // 2} shard(s) of {folder} "
          f"({sum(s['bytes'] for s in manifest['shards']) / 2**20:,.1f} MiB) to {local}", flush=True)
    for name in files + [name for name in _METADATA if (folder / name).exists()]:
        storage.download(folder / name, local / name)
    storage.write_bytes(local / token_shards.MANIFEST, manifest_bytes)
    return local
