"""Byte-level BPE of ANDREA: 256 byte tokens + merges + `<|endoftext|>` (8449 = 256 + 8192 + 1).

Trained with HF `tokenizers` on the training corpus on first use, cached by the corpus's hash and
the vocabulary size, and saved with each run. Byte-level pre-tokenization and decoding make
`decode(encode(s)) == s` hold for every Unicode string.
"""
from __future__ import annotations

import os
import pathlib
from typing import Iterable

import numpy as np

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOT = "<|endoftext|>"


def default_cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("ANDREA_CACHE", pathlib.Path.home() / ".cache" / "andrea_jax"))


def train(texts: Iterable[str], vocab_size: int = 8449) -> Tokenizer:
    """Trains a byte-level BPE with exactly `vocab_size` tokens; EOT gets id 0."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=1, special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(
            f"the corpus yields only {tok.get_vocab_size() - 257} BPE merges; a vocabulary of "
            f"{vocab_size} needs {vocab_size - 257}: use a larger corpus or a smaller model.vocab_size")
    return tok


def load_or_train_at(path: pathlib.Path, texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """The tokenizer saved at `path`, or one trained on `texts` (read only then) and saved there."""
    path = pathlib.Path(path)
    if path.is_file():
        return Tokenizer.from_file(str(path))
    tok = train(texts, vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tok.save(str(tmp))
    os.replace(tmp, path)  # atomic: concurrent runs never read a half-written file
    return tok


def load(path: str | os.PathLike) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def eot_id(tok: Tokenizer) -> int:
    return tok.token_to_id(EOT)


def encode(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text).ids


def decode(tok: Tokenizer, ids) -> str:
    return tok.decode([int(i) for i in ids], skip_special_tokens=False)


def bytes_per_token(tok: Tokenizer) -> np.ndarray:
    """int32 [vocab]: the UTF-8 bytes each token stands for (EOT: 0). Byte-level BPE spells every
    byte as one character of its alphabet, so a token's string length is its byte count."""
    n = np.zeros(tok.get_vocab_size(), np.int32)
    for token, i in tok.get_vocab().items():
        n[i] = 0 if token == EOT else len(token)
    return n
