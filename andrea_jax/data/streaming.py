"""`data.pretokenize=false`: documents tokenized and packed on the fly, in grain worker processes.

For a corpus read once or twice, where tokenizing it all up front (tokenize.py, prepare.py) costs
more than it saves. The documents of this process's share (every process_count-th, from
process_index) are shuffled by the seed, each epoch anew; grain worker processes
(data.stream_workers; 0 = in this process) tokenize them, append `<|endoftext|>`, and pack the
stream into windows of seq_len + 1 tokens (grain's concat-then-split: a document's tail continues
in the next window). Batches are [global batch / process_count, seq_len + 1] int32, as the
pretokenized loader's.

Slower than the pretokenized path (every epoch tokenizes again, on the host's CPUs) and not
bit-identical to it: documents, not windows, are shuffled, and windows do not share their boundary
token. The iterator's state (grain's get_state: the workers' positions, a few integers) is saved
in checkpoints and restores exactly on the same number of workers and processes; each process
saves and restores its own position only through process 0's state, so a resume on several
processes restarts each at process 0's position in its own share (approximately where it stopped).
"""
from __future__ import annotations

import grain
import numpy as np
from grain.experimental import ConcatThenSplitIterDataset

from andrea_jax.data import loader, tokenizer as tokenizer_lib


class TokenizeDocument:
    """record -> {'tokens': int32 ids + end-of-text}; pickled to the workers as the tokenizer's JSON."""

    def __init__(self, tokenizer_json: str):
        self.tokenizer_json = tokenizer_json
        self._tok = None

    def __getstate__(self):
        return {"tokenizer_json": self.tokenizer_json}

    def __setstate__(self, state):
        self.tokenizer_json, self._tok = state["tokenizer_json"], None

    def __call__(self, record) -> dict:
        if self._tok is None:
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_str(self.tokenizer_json)
        text = record["text"]
        text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
        ids = self._tok.encode(text).ids
        ids.append(tokenizer_lib.eot_id(self._tok))
        return {"tokens": np.asarray(ids, np.int32)}


def _tokens(packed: dict) -> np.ndarray:
    return packed["tokens"]


def _allow_workers() -> None:
    # grain's worker processes read absl flags, which only an absl app parses.
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def train_dataset(records, tokenizer_json: str, *, seq_len: int, global_batch: int, seed: int,
                  process_index: int = 0, process_count: int = 1, workers: int = 2) -> grain.IterDataset:
    """Endless batches [global_batch / process_count, seq_len + 1] packed from this process's documents."""
    local = loader.local_batch_size(global_batch, process_count)
    docs = grain.MapDataset.source(records)[process_index::process_count]
    docs = docs.shuffle(seed=seed % 2**32).repeat(None).map(TokenizeDocument(tokenizer_json))
    packed = ConcatThenSplitIterDataset(docs.to_iter_dataset(), length_struct={"tokens": seq_len + 1})
    batches = packed.map(_tokens).batch(local, drop_remainder=True)
    if workers:
        _allow_workers()
        batches = batches.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    return batches


def val_tokens(records, tokenizer, max_tokens: int) -> np.ndarray:
    """The validation documents' ids (end-of-text after each), tokenized here, up to about max_tokens."""
    from andrea_jax.data import tokenize

    parts, n = [], 0
    for ids, _ in tokenize.encode_stream(tokenizer, tokenize.iter_texts(records)):
        parts.append(ids)
        n += len(ids)
        if n >= max_tokens:
            break
    return np.concatenate(parts) if parts else np.zeros(0, np.uint16)
