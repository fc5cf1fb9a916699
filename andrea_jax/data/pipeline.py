"""The data path of a run: source -> tokenizer -> cached tokens -> grain loader + fixed validation
batches. `build(cfg, workdir)` is all the trainer calls.

The tokens are always a token dataset of token_shards.py: for embedded, files and tfds the cache of
one shard made here on first use (token_cache.py); for data.source=prepared the K shards that
`python -m andrea_jax.data.prepare` wrote.

The validation set is a separate split where the source has one (data.tfds_val_split), otherwise
the last data.val_fraction of the token stream; either way it is
fixed for a given dataset and tokenizer, and the same on every run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import pathlib

import jax
from tokenizers import Tokenizer

from andrea_jax import ramps
from andrea_jax.config_text import parse_mixture
from andrea_jax.data import (bucket_cache, loader, mixture as mixture_lib, sampling, sources, storage, token_cache,
                             token_shards, tokenizer as tokenizer_lib)
from andrea_jax.errors import DataError
from andrea_jax.workdir import Workdir

EMBEDDED_CORPUS = sources.EMBEDDED_CORPUS
TOKENIZER_SAMPLE_CHARS = 64 << 20   # default data.tokenizer_sample_mb: a trained tokenizer's uniform sample


@dataclasses.dataclass(frozen=True)
class TokenizedCorpus:
    tokenizer: Tokenizer
    train_tokens: token_shards.ShardedTokens   # token ids, end-of-text after each document (np.asarray: an array)
    val_tokens: token_shards.ShardedTokens
    key: str                   # the dataset, splits and tokenizer: what a saved loader state must match
    mixture: mixture_lib.Mixture | None = None   # data.mixture's sources; train/val_tokens are then its first's

    @property
    def n_train(self) -> int:
        return sum(map(len, self.mixture.train_parts)) if self.mixture else len(self.train_tokens)

    @property
    def train_size(self) -> str:
        return f"{self.n_train:,} training tokens" + (f" of {len(self.mixture.names)} mixed datasets"
                                                      if self.mixture else "")


def read_text(path: pathlib.Path) -> str:
    """One text file (invalid UTF-8 replaced), for tools and tests that want the raw corpus."""
    if not path.is_file():
        raise DataError(f"corpus file {path} does not exist")
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise DataError(f"corpus file {path} is empty")
    return text


def _cache_dir_beside(dataset_dir: pathlib.Path, cache_dir: pathlib.Path) -> pathlib.Path:
    """Beside the dataset when that folder is writable, else a folder of our cache named after it."""
    if os.access(dataset_dir, os.W_OK):
        return dataset_dir
    return cache_dir / "tokens" / hashlib.sha256(str(dataset_dir).encode()).hexdigest()[:16]


def _tokenizer(source: sources.Source, data_cfg, vocab_size: int, beside: pathlib.Path, split: str) -> Tokenizer:
    if data_cfg.tokenizer:
        if not pathlib.Path(data_cfg.tokenizer).is_file():
            raise DataError(f"data.tokenizer {data_cfg.tokenizer}: no such file")
        tok = tokenizer_lib.load(data_cfg.tokenizer)
    else:
        try:
            sample_mb = getattr(data_cfg, "tokenizer_sample_mb", TOKENIZER_SAMPLE_CHARS >> 20)
            suffix = "" if sample_mb << 20 == TOKENIZER_SAMPLE_CHARS else f"-s{sample_mb}mb"
            tok = tokenizer_lib.load_or_train_at(
                beside / f"tokenizer-{token_cache.safe_name(split)}-v{vocab_size}{suffix}.json",
                sampling.sample_texts(source.train, sample_mb << 20, seed=0), vocab_size)
        except ValueError as e:  # too little text for the vocabulary
            raise DataError(f"corpus {source.name}: {e}") from None
    if tok.get_vocab_size() != vocab_size:
        raise DataError(f"tokenizer has {tok.get_vocab_size()} tokens but model.vocab_size is {vocab_size}")
    return tok


@contextlib.contextmanager
def _build_lock(cache_dir: pathlib.Path):
    """Processes sharing a cache build each dataset, tokenizer and token file once, one at a time."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / "build.lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _open_prepared(data_cfg, vocab_size: int, cache_dir: pathlib.Path, path: str | None = None,
                   what: str = "data.path"):
    """(tokenizer, tokens, key) of a dataset written by `python -m andrea_jax.data.prepare` (at
    `path`, by default data.path; `what` names it in messages); one in a bucket (gs://) is read from
    its local copy (bucket_cache.py)."""
    path = str(data_cfg.path) if path is None else path
    folder = storage.path(path, what)
    if storage.is_remote(folder):
        with _build_lock(cache_dir):
            folder = bucket_cache.local_copy(folder, cache_dir)
    folder = folder.expanduser()
    if not folder.is_dir():
        raise DataError(f"{what} {path!r}: no prepared token dataset there (no such folder)")
    manifest = token_shards.read_manifest(folder)
    tok_file = pathlib.Path(data_cfg.tokenizer) if data_cfg.tokenizer else folder / "tokenizer.json"
    if not tok_file.is_file():
        raise DataError(f"tokenizer {tok_file} of prepared dataset {folder} does not exist")
    tok = tokenizer_lib.load(tok_file)
    tokens = token_shards.ShardedTokens.open(folder, expect_tokenizer=token_cache.tokenizer_hash(tok),
                                             tokenizer_name=f"tokenizer {tok_file}")
    if tok.get_vocab_size() != vocab_size:
        raise DataError(f"tokenizer {tok_file} has {tok.get_vocab_size()} tokens but model.vocab_size is {vocab_size}")
    return tok, tokens, f"prepared:{manifest.get('source_key', folder.name)}:{manifest['tokenizer']}"


def _held_out(tokens, val_fraction: float):
    n_val = int(len(tokens) * val_fraction)
    return tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val:]


def mixed_corpus(data_cfg, *, vocab_size: int, seq_len: int, cache_dir) -> TokenizedCorpus:
    """data.mixture's prepared datasets, one tokenizer for all; each holds out its own val_fraction
    tail, and the validation set is the first entry's."""
    entries = parse_mixture(data_cfg.mixture)
    names = mixture_lib.source_names([path for path, _ in entries])
    opened = [_open_prepared(data_cfg, vocab_size, cache_dir, path, "data.mixture entry")
              for path, _ in entries]
    tok, keys, parts = opened[0][0], [], []
    for (path, weight), (other, tokens, key) in zip(entries, opened):
        if token_cache.tokenizer_hash(other) != token_cache.tokenizer_hash(tok):
            raise DataError(f"data.mixture entry {path}: tokenized by another tokenizer than {entries[0][0]}; "
                            f"a mixture's datasets must share one tokenizer")
        train, val = _held_out(tokens, data_cfg.val_fraction)
        if len(train) < seq_len + 1 or (not parts and len(val) < seq_len + 1):
            raise DataError(f"data.mixture entry {path}: {len(tokens)} tokens are too few for one window of "
                            f"model.seq_len + 1 = {seq_len + 1} in its training and validation parts")
        keys.append(f"{key}@{weight:.6g}")
        parts.append((train, val))
    mixture = mixture_lib.Mixture(names, tuple(w for _, w in entries), tuple(train for train, _ in parts))
    return TokenizedCorpus(tok, parts[0][0], parts[0][1], "mixture:" + ";".join(keys), mixture)


def tokenized_corpus(data_cfg, *, vocab_size: int, seq_len: int, cache_dir=None) -> TokenizedCorpus:
    """Opens the source, loads or trains the tokenizer, loads or builds the token caches."""
    cache_dir = pathlib.Path(cache_dir or tokenizer_lib.default_cache_dir())
    if getattr(data_cfg, "mixture", ""):
        return mixed_corpus(data_cfg, vocab_size=vocab_size, seq_len=seq_len, cache_dir=cache_dir)
    split = data_cfg.tfds_split if data_cfg.source == "tfds" else "train"
    val_tokens = None
    if data_cfg.source == "prepared":
        tok, tokens, key = _open_prepared(data_cfg, vocab_size, cache_dir)
        name = str(data_cfg.path)
    else:
        with _build_lock(cache_dir):
            source = sources.open_source(data_cfg, cache_dir)
            beside = _cache_dir_beside(source.dataset_dir, cache_dir)
            tok = _tokenizer(source, data_cfg, vocab_size, beside, split)
            tokens = token_cache.load_or_tokenize(source.train, tok, beside, split, source.name)
            if source.val is not None:
                val_tokens = token_cache.load_or_tokenize(source.val, tok, beside, data_cfg.tfds_val_split,
                                                          source.name)
        name = source.name
        # Location-free: the same data restores from its data_dir moved elsewhere; n_tokens (in the fingerprint)
        # adds the rest.
        key = f"{'/'.join(source.dataset_dir.parts[-3:])}:{split}:{token_cache.tokenizer_hash(tok)}"
    if val_tokens is not None:
        train_tokens = tokens
        val_name = f"validation split {data_cfg.tfds_val_split!r}"
    else:
        train_tokens, val_tokens = _held_out(tokens, data_cfg.val_fraction)
        val_name = f"validation part (data.val_fraction={data_cfg.val_fraction})"
    for part_name, part in (("training part", train_tokens), (val_name, val_tokens)):
        if len(part) < seq_len + 1:
            raise DataError(f"the {part_name} of corpus {name} has {len(part)} tokens, fewer than "
                            f"one window of model.seq_len + 1 = {seq_len + 1}")
    return TokenizedCorpus(tok, train_tokens, val_tokens, key)


def fingerprint(cfg, corpus: TokenizedCorpus) -> dict:
    out = loader.state_fingerprint(tokens_key=corpus.key, n_tokens=corpus.n_train,
                                   seq_len=cfg.model.seq_len, global_batch=cfg.train.batch_size,
                                   seed=cfg.train.order_seed)
    # a ramp's steps read other windows: its state continues only under the same stages
    return out | ({"ramps": [cfg.train.batch_ramp, cfg.model.seq_len_ramp]} if ramps.ramped(cfg) else {})


def train_dataset(cfg, corpus: TokenizedCorpus, process_index: int, process_count: int):
    """The endless training batches of this process: of one shape, or of a ramp's changing shapes."""
    m_cfg, t_cfg = cfg.model, cfg.train
    split = dict(seq_len=m_cfg.seq_len, seed=t_cfg.order_seed, process_index=process_index,
                 process_count=process_count)
    if ramps.ramped(cfg):
        stage = lambda step: (*ramps.shape_at(cfg, step), ramps.tokens_at(cfg, step) // m_cfg.seq_len)
        return loader.staged_dataset(corpus.train_tokens, full_batch=t_cfg.batch_size, stage=stage, **split)
    if corpus.mixture:
        return mixture_lib.train_dataset(corpus.mixture, global_batch=t_cfg.batch_size, **split)
    return loader.train_dataset(corpus.train_tokens, global_batch=t_cfg.batch_size, **split)


def build(cfg, workdir=None, *, cache_dir=None, process_index: int | None = None,
          process_count: int | None = None):
    """(corpus, train batch iterator, validation batches) for this process; saves the tokenizer
    into `workdir` when given. Batches are int32 [train.batch_size / process_count, seq_len + 1] (with a
    ramp, of the step's shape: andrea_jax.ramps)."""
    index = jax.process_index() if process_index is None else process_index
    count = jax.process_count() if process_count is None else process_count
    m_cfg, t_cfg = cfg.model, cfg.train
    corpus = tokenized_corpus(cfg.data, vocab_size=m_cfg.vocab_size, seq_len=m_cfg.seq_len, cache_dir=cache_dir)
    batches = loader.train_iterator(train_dataset(cfg, corpus, index, count))
    if workdir is not None:
        corpus.tokenizer.save(str(Workdir(workdir).tokenizer))
    val = loader.val_batches(corpus.val_tokens, seq_len=m_cfg.seq_len, global_batch=t_cfg.batch_size,
                             max_batches=t_cfg.eval_batches, process_index=index, process_count=count)
    return corpus, batches, val


def tokens_by_source(cfg, corpus: TokenizedCorpus, steps: int) -> dict[str, int]:
    """{"tokens/NAME": tokens each mixed source gave the first `steps` steps}; {} without data.mixture."""
    if corpus.mixture is None:
        return {}
    return mixture_lib.tokens_seen(corpus.mixture, steps, cfg.train.batch_size, cfg.model.seq_len)


def get_state(batches, cfg, corpus: TokenizedCorpus) -> dict:
    """The train iterator's position as a JSON-able dict (saved in every checkpoint)."""
    return loader.get_state(batches, fingerprint(cfg, corpus))


def set_state(batches, cfg, corpus: TokenizedCorpus, state: dict, where: str = "the saved data state") -> None:
    """Continues `batches` where the run that saved `state` stopped (any process count, same global batch)."""
    loader.set_state(batches, state, fingerprint(cfg, corpus), where=where)
