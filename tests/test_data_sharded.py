"""The loader on a token dataset of many shards: the same windows as on one flat array, window by
window; disjoint per-process shares covering each epoch; only the shards a process's windows need
are opened; resume exact across shard boundaries.

The tokens are arange(N) cut into shards of uneven sizes (one empty), and each shard into documents
(records) of uneven sizes, so every window says where it came from, and a window that straddles a
boundary is read from two (or three) shards and several records.
"""
import json

import numpy as np
import pytest
import tensorflow_datasets as tfds

from andrea_jax.data import loader, shard_writer, token_shards
from andrea_jax.errors import DataError

T = 4
N_TOKENS = 37 * T + 1
TOKENS = np.arange(N_TOKENS, dtype=np.uint16)
SIZES = [30, 3, 0, 50, 17, N_TOKENS - 100]   # boundaries inside windows; a shard shorter than a window


@pytest.fixture
def sharded(tmp_path):
    markers, start = [], 0
    for s, size in enumerate(SIZES):
        ids = TOKENS[start:start + size]
        start += size
        cuts = [c for c in (1, 2, 7, 20, 33, 45) if c < size]   # documents of 1, 1, 5, 13, ... tokens
        lengths = np.diff([0, *cuts, size]) if size else np.zeros(0, np.int64)
        markers.append(shard_writer.write_shard(tmp_path, token_shards.shard_file(s, len(SIZES)),
                                                [(ids, lengths)], np.uint16, {"tokenizer": "abc"}))
    shard_writer.write_manifest(tmp_path, markers, tokenizer="abc")
    return token_shards.ShardedTokens.open(tmp_path, expect_tokenizer="abc")


def test_the_shards_are_the_flat_stream_and_slices_are_views(sharded):
    assert len(sharded) == N_TOKENS and sharded.opened_shards() == []
    np.testing.assert_array_equal(np.asarray(sharded), TOKENS)
    part = sharded[25:140]
    assert isinstance(part, token_shards.ShardedTokens) and len(part) == 115
    np.testing.assert_array_equal(np.asarray(part), TOKENS[25:140])
    np.testing.assert_array_equal(np.asarray(part[10:20]), TOKENS[35:45])
    assert part[-1] == TOKENS[139]


def test_sharded_loader_equals_flat_loader_window_by_window(sharded):
    n = loader.num_windows(N_TOKENS, T)
    np.testing.assert_array_equal(loader.gather_windows(sharded, np.arange(n), T),
                                  loader.gather_windows(TOKENS, np.arange(n), T))
    flat = loader.train_dataset(TOKENS, seq_len=T, global_batch=8, seed=5)
    shards = loader.train_dataset(sharded, seq_len=T, global_batch=8, seed=5)
    for k in range(14):                     # three epochs of 37 windows
        np.testing.assert_array_equal(shards[k], flat[k])
    val = loader.val_batches(sharded[120:], seq_len=T, global_batch=4, max_batches=3)
    np.testing.assert_array_equal(np.concatenate(val), loader.gather_windows(TOKENS[120:], np.arange(7), T))


def test_a_process_opens_only_the_shards_its_windows_need(tmp_path, sharded):
    reopened = token_shards.ShardedTokens.open(tmp_path)
    loader.val_batches(reopened[130:], seq_len=T, global_batch=4, max_batches=1)
    assert reopened.opened_shards() == [5]  # the validation tail lies in the last shard only
    loader.gather_windows(reopened, [8], T)  # tokens 32..36: shards 1, (the empty 2), 3
    assert reopened.opened_shards() == [1, 3, 5]


@pytest.mark.parametrize("process_count", [2, 4])
def test_shares_are_disjoint_and_cover_each_epoch(sharded, process_count):
    n, global_batch = 37, 8
    shares = [loader.train_dataset(sharded, seq_len=T, global_batch=global_batch, seed=1, process_index=p,
                                   process_count=process_count) for p in range(process_count)]
    single = loader.train_dataset(TOKENS, seq_len=T, global_batch=global_batch, seed=1)
    stream = []
    for k in range(14):
        rows = np.concatenate([share[k] for share in shares])
        np.testing.assert_array_equal(rows, single[k])  # the processes' rows are the one-process batch
        np.testing.assert_array_equal(rows, rows[:, :1] + np.arange(T + 1))
        stream += (rows[:, 0] // T).tolist()
    for e in range(3):
        assert sorted(stream[e * n:(e + 1) * n]) == list(range(n))


def test_resume_across_a_shard_boundary_is_exact(sharded, tmp_path):
    fingerprint = loader.state_fingerprint(tokens_key="k", n_tokens=N_TOKENS, seq_len=T, global_batch=4, seed=2)
    it = loader.train_iterator(loader.train_dataset(sharded, seq_len=T, global_batch=4, seed=2))
    for _ in range(7):
        next(it)
    saved = json.loads(json.dumps(loader.get_state(it, fingerprint)))
    expected = [next(it) for _ in range(6)]
    starts = np.concatenate(expected)[:, 0]
    boundaries = np.cumsum(SIZES)[:-1]
    straddling = [s for s in starts if any(s < b < s + T + 1 for b in boundaries)]
    assert straddling  # the batches after the resume point read windows that cross a shard boundary
    again = loader.train_iterator(loader.train_dataset(token_shards.ShardedTokens.open(tmp_path), seq_len=T,
                                                       global_batch=4, seed=2))
    loader.set_state(again, saved, fingerprint)
    for want in expected:
        np.testing.assert_array_equal(next(again), want)


def test_tfds_reads_the_shards_as_its_own_dataset(sharded, tmp_path):
    source = tfds.builder_from_directory(str(tmp_path)).as_data_source("train")
    assert len(source) == sum(len(sharded.shard_documents(s)) for s in range(len(SIZES)))
    np.testing.assert_array_equal(np.concatenate([source[i]["tokens"] for i in range(len(source))]), TOKENS)


def test_a_damaged_shard_is_one_line_naming_the_file(sharded, tmp_path):
    path = tmp_path / token_shards.shard_file(3, len(SIZES))
    data = bytearray(path.read_bytes())
    data[300] ^= 0xFF   # inside a chunk (record) header: the file keeps its size, Riegeli's hash catches it
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=rf"^token shard {path} is unreadable \(Corrupted Riegeli/records file: "
                                        rf"chunk header hash mismatch .*\): prepare the dataset again$"):
        loader.gather_windows(token_shards.ShardedTokens.open(tmp_path), [10], T)   # tokens 40..44: shard 3
    path.write_bytes(bytes(data[:1000]))
    with pytest.raises(DataError, match=rf"^token shard {path} has 1,000 bytes, not {len(data):,}: prepare the "
                                        rf"dataset again \(a rerun redoes only the missing shards once "
                                        rf"{tmp_path}/manifest.json is deleted\)$"):
        token_shards.ShardedTokens.open(tmp_path)


def test_an_index_that_does_not_match_its_records_is_one_line_naming_the_record(sharded, tmp_path):
    index = tmp_path / token_shards.index_file(token_shards.shard_file(3, len(SIZES)))
    ends = np.load(index)
    ends[1] += 1   # documents 1 and 2 of shard 3 (1 and 5 tokens) said to be 2 and 4
    np.save(index, ends)
    with pytest.raises(DataError, match=rf"^token shard {tmp_path}/{token_shards.shard_file(3, len(SIZES))} record 1 "
                                        rf"is not the 2 token ids its index says: prepare the dataset again$"):
        loader.gather_windows(token_shards.ShardedTokens.open(tmp_path), [8], T)   # tokens 32..36: its records 0 - 2


def test_indexing_and_slicing_follow_numpy(sharded):
    assert sharded[N_TOKENS - 1] == TOKENS[-1] and sharded[-N_TOKENS] == TOKENS[0]
    for outside in (N_TOKENS, -N_TOKENS - 1):
        with pytest.raises(IndexError, match=f"^{outside}$"):   # numpy's own words, not an index inside
            sharded[outside]
    assert len(sharded[10:5]) == 0 and np.asarray(sharded[10:5]).shape == (0,)   # a reversed slice is empty
    np.testing.assert_array_equal(sharded[3:40:3], TOKENS[3:40:3])
    np.testing.assert_array_equal(sharded[::-7], TOKENS[::-7])


def test_a_copy_for_a_worker_process_leaves_the_opened_readers_behind(sharded):
    import pickle
    sharded[40]
    assert sharded.opened_shards() == [3]
    copy = pickle.loads(pickle.dumps(sharded))
    assert copy.opened_shards() == [] and copy[40] == 40 and copy.opened_shards() == [3]


def rewrite_json(path, change):
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def test_a_bad_manifest_or_index_is_one_line_naming_the_file(sharded, tmp_path):
    manifest, shard3 = tmp_path / "manifest.json", tmp_path / token_shards.shard_file(3, len(SIZES))
    index3 = tmp_path / token_shards.index_file(shard3.name)
    good = manifest.read_text()
    manifest.write_text("[1]")
    with pytest.raises(DataError, match=rf"^token dataset manifest {manifest} is not a JSON object; delete it to "
                                        rf"rebuild$"):
        token_shards.ShardedTokens.open(tmp_path)
    rewrite_json(manifest, lambda m: dict(json.loads(good), format="andrea-tokens/1"))
    with pytest.raises(DataError, match=rf"^{manifest} is not a token dataset of format andrea-tokens/2 \(it says "
                                        rf"'andrea-tokens/1'\): prepare it again$"):
        token_shards.ShardedTokens.open(tmp_path)
    # shard 3 said to hold one document more than its file has
    rewrite_json(manifest, lambda m: dict(json.loads(good), shards=[
        dict(s, documents=s["documents"] + (s["file"] == shard3.name)) for s in json.loads(good)["shards"]]))
    with pytest.raises(DataError, match=rf"^token shard {shard3} has 7 records and an index of 7, not 8: prepare "
                                        rf"the dataset again$"):
        loader.gather_windows(token_shards.ShardedTokens.open(tmp_path), [10], T)
    ends = np.load(index3)
    np.save(index3, np.append(ends, ends[-1]))   # ... and its index agreeing
    with pytest.raises(DataError, match=rf"^token shard {shard3} has 7 records and an index of 8, not 8: prepare "
                                        rf"the dataset again$"):
        loader.gather_windows(token_shards.ShardedTokens.open(tmp_path), [10], T)
    manifest.write_text(good)
    np.save(index3, ends[:-1])
    with pytest.raises(DataError, match=rf"^token shard {shard3} has 7 records and an index of 6, not 7: prepare "
                                        rf"the dataset again$"):
        loader.gather_windows(token_shards.ShardedTokens.open(tmp_path), [10], T)
    index3.write_bytes(b"not an array")
    with pytest.raises(DataError, match=rf"^token shard {shard3} is unreadable \(ValueError: .*\): prepare the "
                                        rf"dataset again$"):
        loader.gather_windows(token_shards.ShardedTokens.open(tmp_path), [10], T)
    index3.unlink()
    with pytest.raises(DataError, match=rf"^token shard {shard3} has no index {index3.name}: prepare the dataset "
                                        rf"again \(a rerun redoes only the missing shards once {manifest} is "
                                        rf"deleted\)$"):
        token_shards.ShardedTokens.open(tmp_path)


def test_a_record_that_is_not_a_tokens_example_is_named(tmp_path, monkeypatch):
    # a shard whose records carry another feature name: the same lengths, another header
    monkeypatch.setattr(token_shards, "FEATURE", "tokenz")
    monkeypatch.setattr(token_shards, "_HEADERS", {})
    marker = shard_writer.write_shard(tmp_path, token_shards.shard_file(0, 1), [(TOKENS[:20], np.array([5, 15]))],
                                      np.uint16, {"tokenizer": "abc"})
    shard_writer.write_manifest(tmp_path, [marker], tokenizer="abc")
    monkeypatch.undo()
    with pytest.raises(DataError, match=rf"^token shard {tmp_path}/{token_shards.shard_file(0, 1)} record 0 is not "
                                        rf"the 5 token ids its index says: prepare the dataset again$"):
        np.asarray(token_shards.ShardedTokens.open(tmp_path))
