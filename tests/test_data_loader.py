"""The grain loader: packed windows, per-process shares of each epoch, and resumable state.

The token array is arange(N), so every window says where it came from: window w starts with w*T.
"""
import json

import numpy as np
import pytest

from andrea_jax.data import loader
from andrea_jax.errors import DataError

T = 4
N_TOKENS = 37 * T + 1            # 37 windows: not a multiple of the batch, so batches straddle epochs
TOKENS = np.arange(N_TOKENS, dtype=np.uint32)


def window_ids(batch):
    assert batch.shape[1] == T + 1
    np.testing.assert_array_equal(batch, batch[:, :1] + np.arange(T + 1))  # each row is one whole window
    return (batch[:, 0] // T).tolist()


def batches(global_batch, seed=0, process_index=0, process_count=1):
    return loader.train_dataset(TOKENS, seq_len=T, global_batch=global_batch, seed=seed,
                                process_index=process_index, process_count=process_count)


@pytest.mark.parametrize("process_count", [2, 4])
def test_shares_are_disjoint_and_together_read_every_window_of_each_epoch_once(process_count):
    n, global_batch, steps = 37, 8, 14
    shares = [batches(global_batch, process_index=p, process_count=process_count)
              for p in range(process_count)]
    single = batches(global_batch)
    stream = []
    for k in range(steps):
        rows = [window_ids(share[k]) for share in shares]
        assert all(len(r) == global_batch // process_count for r in rows)
        flat = [w for r in rows for w in r]
        assert len(set(flat)) == len(flat), f"batch {k}: shares overlap"
        assert flat == window_ids(single[k])  # the same global batch as one process would read
        stream += flat
    epochs = [stream[e * n:(e + 1) * n] for e in range(len(stream) // n)]
    assert len(epochs) == 3
    for epoch in epochs:
        assert sorted(epoch) == list(range(n))
    assert epochs[0] != epochs[1] != epochs[2]  # reshuffled every epoch
    assert epochs[0] != list(range(n))          # shuffled at all


def test_windows_of_t_plus_one_tokens_overlapping_by_one_fit_inside_the_corpus():
    assert [loader.num_windows(n, T) for n in (0, 1, T, T + 1, 37 * T, 37 * T + 1)] == [0, 0, 0, 1, 36, 37]
    last = loader.gather_windows(TOKENS, [36], T)   # the 37th window ends on the corpus's last token
    assert last[0, -1] == TOKENS[-1]


def test_a_batch_of_one_reads_the_same_stream_a_window_at_a_time():
    by_eight = [w for k in range(5) for w in window_ids(batches(8)[k])]  # 40 windows: into the second epoch
    one = batches(1)
    assert [w for k in range(40) for w in window_ids(one[k])] == by_eight


def test_the_shuffle_is_seeded():
    assert window_ids(batches(8, seed=3)[0]) == window_ids(batches(8, seed=3)[0])
    assert [window_ids(batches(8, seed=3)[k]) for k in range(4)] != \
        [window_ids(batches(8, seed=4)[k]) for k in range(4)]


def test_restoring_the_state_continues_with_the_identical_next_batch(tmp_path):
    fingerprint = loader.state_fingerprint(tokens_key="k", n_tokens=N_TOKENS, seq_len=T, global_batch=8, seed=1)
    it = loader.train_iterator(batches(8, seed=1))
    for _ in range(6):
        next(it)
    saved = json.loads(json.dumps(loader.get_state(it, fingerprint)))  # plain JSON, as checkpoints hold it
    expected = [next(it) for _ in range(5)]

    again = loader.train_iterator(batches(8, seed=1))
    loader.set_state(again, saved, fingerprint)
    for want in expected:
        np.testing.assert_array_equal(next(again), want)

    # On another process count with the same global batch: the processes' rows of the next batch
    # are exactly the rows one process would have read.
    for count in (2, 4):
        shares = [loader.train_iterator(batches(8, seed=1, process_index=p, process_count=count))
                  for p in range(count)]
        for share in shares:
            loader.set_state(share, saved, fingerprint)
        for want in expected:
            np.testing.assert_array_equal(np.concatenate([next(s) for s in shares]), want)


def test_a_state_from_other_data_or_batching_is_refused_by_name(tmp_path):
    saved = loader.state_fingerprint(tokens_key="k", n_tokens=N_TOKENS, seq_len=T, global_batch=8, seed=1)
    it = loader.train_iterator(batches(8, seed=1))
    next(it)
    state = json.loads(json.dumps(loader.get_state(it, saved)))
    now = dict(saved, global_batch=16)
    with pytest.raises(DataError,
                       match=r"checkpoint 7 belongs to other data or batching \(global_batch: saved 8, now 16\)"):
        loader.set_state(loader.train_iterator(batches(16, seed=1)), state, now, where="checkpoint 7")
    with pytest.raises(DataError, match="checkpoint 7 is not a loader state of format"):
        loader.set_state(it, {"grain": state["grain"]}, saved, where="checkpoint 7")
    # another seed shuffles other windows into the same positions: the state is refused too
    with pytest.raises(DataError, match=r"^checkpoint 7 belongs to other data or batching \(seed: saved 1, now 2\); "):
        loader.set_state(loader.train_iterator(batches(8, seed=2)), state,
                         loader.state_fingerprint(tokens_key="k", n_tokens=N_TOKENS, seq_len=T, global_batch=8,
                                                  seed=2), where="checkpoint 7")


def test_validation_batches_are_fixed_windows_in_order_split_per_process():
    val = loader.val_batches(TOKENS, seq_len=T, global_batch=8, max_batches=3)
    assert [window_ids(b) for b in val] == [list(range(0, 8)), list(range(8, 16)), list(range(16, 24))]
    halves = [loader.val_batches(TOKENS, seq_len=T, global_batch=8, max_batches=3, process_index=p,
                                 process_count=2) for p in range(2)]
    for k in range(3):
        assert window_ids(halves[0][k]) + window_ids(halves[1][k]) == window_ids(val[k])
    # Fewer windows than the batches asked for: the last batch is smaller, never padded.
    short = loader.val_batches(TOKENS[: 10 * T + 1], seq_len=T, global_batch=8, max_batches=3)
    assert [window_ids(b) for b in short] == [list(range(8)), [8, 9]]
    # Split over 2 processes, a last batch of 3 windows gives each process 1: shares stay equal.
    odd = [loader.val_batches(TOKENS[: 11 * T + 1], seq_len=T, global_batch=8, max_batches=3, process_index=p,
                              process_count=2) for p in range(2)]
    assert [[window_ids(b) for b in share] for share in odd] == [[[0, 1, 2, 3], [8]], [[4, 5, 6, 7], [9]]]


def test_too_few_windows_for_one_batch_says_so():
    too_few = (r"37 windows of seq_len \+ 1 = 5, fewer than one batch of train.batch_size=64: use a larger corpus "
               r"\(data.source=files or tfds\) or --set train.batch_size=N with N <= 37")
    with pytest.raises(DataError, match=too_few):
        batches(64)
    with pytest.raises(DataError, match="train.batch_size=8 is not divisible by the 3 processes"):
        batches(8, process_count=3)
    with pytest.raises(DataError, match=r"^the training tokens make 37 windows of seq_len \+ 1 = 5, fewer than one "
                                        r"batch of train.batch_size=64: use a larger corpus or a smaller batch$"):
        loader.staged_dataset(TOKENS, seq_len=T, full_batch=64, seed=0, stage=lambda k: (64, T, 64 * k))
