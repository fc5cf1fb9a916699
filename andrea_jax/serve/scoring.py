"""Scoring tokens with a loaded model: the one jitted log-probability function, rolling
windows over documents (as lm-evaluation-harness's `loglikelihood_rolling`), perplexity and bits
per byte of a token stream, and the log-likelihood of a continuation (lm-eval's `loglikelihood`).
Shared by `andrea_jax.serve.evaluate`, `andrea_jax.serve.tasks` and the lm-eval adapter.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tokenizers import Tokenizer

from andrea_jax.data import tokenizer as tokenizer_lib
from andrea_jax.errors import DataError
from andrea_jax.serve import load

DEFAULT_BATCH = 32
MIN_BUCKET = 16            # shortest padded length: a few compilations serve every request length
WINDOWS_PER_CHUNK = 1024   # rolling windows held in memory at once, however long the corpus


# ---------------------------------------------------------------------------------------------
# Scoring tokens: the one jitted function everything below goes through.

_LOGPROB_FNS: dict = {}


def _logprob_fn(loaded: load.LoadedModel, impl: str | None):
    """jit(params, alphas_L, tokens_BT, targets_BT) -> (log p(target) [B,T], target is argmax [B,T]).

    Params and alphas are arguments, not constants, so one compilation serves every checkpoint of
    a model shape; one function per (model config, kernel impl)."""
    model = loaded.model(impl)
    key = (loaded.cfg.model, model.impl)
    if key not in _LOGPROB_FNS:
        def logprobs(params, alphas_L, tokens_BT, targets_BT):
            logits_BTV = model.apply({"params": params}, tokens_BT, alphas_L).logits.astype(jnp.float32)
            logp_BTV = jax.nn.log_softmax(logits_BTV, axis=-1)
            logprob_BT = jnp.take_along_axis(logp_BTV, targets_BT[..., None], axis=-1)[..., 0]
            return logprob_BT, jnp.argmax(logits_BTV, axis=-1) == targets_BT

        _LOGPROB_FNS[key] = jax.jit(logprobs)
    return _LOGPROB_FNS[key]


def _bucket(n: int, limit: int) -> int:
    """The padded size for n: a power of two (at least MIN_BUCKET), at most `limit`."""
    return min(limit, max(MIN_BUCKET, 1 << max(n - 1, 0).bit_length()))


def _place(params, array_BT: np.ndarray):
    """The batch split over the devices the parameters are replicated on (when it divides)."""
    sharding = jax.tree.leaves(params)[0].sharding
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return array_BT
    mesh = sharding.mesh
    spec = jax.sharding.PartitionSpec(mesh.axis_names[0]) if array_BT.shape[0] % mesh.size == 0 \
        else jax.sharding.PartitionSpec()
    return jax.device_put(array_BT, jax.sharding.NamedSharding(mesh, spec))


def _to_host(x_BT: jax.Array) -> np.ndarray:
    """The whole array on this host. Under a mesh that spans processes (train.eval_tasks in a
    multi-process run) each process holds only its rows; every process gathers all of them."""
    if x_BT.is_fully_addressable:
        return np.asarray(x_BT)
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x_BT, tiled=True))


def token_logprobs(loaded: load.LoadedModel, sequences: Sequence[Sequence[int]], *,
                   batch_size: int = DEFAULT_BATCH, impl: str | None = None
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each sequence of 2..seq_len+1 ids: (log p of each token after the first given all tokens
    before it [n-1] float32, whether that token is the model's argmax choice [n-1] bool).

    Sequences are sorted by length and right-padded (a causal model never sees the padding) to a
    few bucketed shapes [B, T], so a whole evaluation compiles only a handful of times."""
    seq_len = loaded.cfg.model.seq_len
    for s in sequences:
        if not 2 <= len(s) <= seq_len + 1:
            raise ValueError(f"a scored sequence has {len(s)} tokens; it needs 2..{seq_len + 1}")
    fn, alphas_L = _logprob_fn(loaded, impl), loaded.alphas()
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))
    out: list = [None] * len(sequences)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        B = _bucket(len(rows), batch_size) if len(rows) < batch_size else batch_size
        T = _bucket(len(sequences[rows[0]]) - 1, seq_len)
        tokens_BT, targets_BT = np.zeros((B, T), np.int32), np.zeros((B, T), np.int32)
        for r, i in enumerate(rows):
            s = np.asarray(sequences[i], np.int32)
            tokens_BT[r, :len(s) - 1], targets_BT[r, :len(s) - 1] = s[:-1], s[1:]
        logprob_BT, greedy_BT = fn(loaded.params, alphas_L, _place(loaded.params, tokens_BT),
                                   _place(loaded.params, targets_BT))
        logprob_BT, greedy_BT = _to_host(logprob_BT), _to_host(greedy_BT)
        for r, i in enumerate(rows):
            n = len(sequences[i]) - 1
            out[i] = (logprob_BT[r, :n], greedy_BT[r, :n])
    return out


# ---------------------------------------------------------------------------------------------
# Rolling log-likelihood of whole documents (lm-eval's loglikelihood_rolling).

def rolling_windows(ids: Sequence[int], *, prefix: int, seq_len: int, stride: int | None = None
                    ) -> list[tuple[np.ndarray, int]]:
    """(sequence, n_scored) windows that score every token of `ids` exactly once: a sequence of at
    most seq_len + 1 ids whose last n_scored tokens are scored, each given all before it.

    The first window is `prefix` + the first seq_len tokens; each later one scores the next
    `stride` tokens (fewer at the end) after a full seq_len-token input. stride = seq_len is
    lm_eval.utils.get_rolling_token_windows with context_len=1 (its default); stride S is its
    context_len = seq_len - S + 1."""
    stride = seq_len if stride is None else stride
    if not 1 <= stride <= seq_len:
        raise ValueError(f"stride {stride} must be in 1..seq_len={seq_len}")
    ids = np.asarray(ids, np.int64)
    if len(ids) == 0:
        return []
    first = min(seq_len, len(ids))
    windows = [(np.concatenate([[prefix], ids[:first]]), first)]
    done = first
    while done < len(ids):
        n_new = min(len(ids) - done, stride)
        end = done + n_new
        windows.append((ids[end - seq_len - 1:end], n_new))  # end > seq_len: never a negative start
        done = end
    return windows


def _chunks(iterable, size: int):
    it = iter(iterable)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def _window_logprobs(loaded, documents, *, stride, batch_size, impl):
    """(document index, log p of the tokens the window scores) for every window of every document,
    in order; windows of all documents are batched together and streamed in chunks, so a corpus
    of any length fits in memory. A document's windows score its tokens in order."""
    prefix = tokenizer_lib.eot_id(loaded.tokenizer)
    seq_len = loaded.cfg.model.seq_len

    def windows():
        for d, ids in enumerate(documents):
            for seq, n_scored in rolling_windows(ids, prefix=prefix, seq_len=seq_len, stride=stride):
                yield d, seq, n_scored

    for chunk in _chunks(windows(), WINDOWS_PER_CHUNK):
        scored = token_logprobs(loaded, [seq for _, seq, _ in chunk], batch_size=batch_size, impl=impl)
        for (d, _, n_scored), (logprob, _) in zip(chunk, scored):
            yield d, logprob[-n_scored:]


def rolling_nlls(loaded: load.LoadedModel, documents: Sequence[Sequence[int]], *,
                 stride: int | None = None, batch_size: int = DEFAULT_BATCH,
                 impl: str | None = None) -> np.ndarray:
    """[len(documents)] summed NLL (nats) of each document, every token scored once (see
    rolling_windows), the first from an end-of-text context: lm-eval's loglikelihood_rolling."""
    nll = np.zeros(len(documents), np.float64)
    for d, logprob in _window_logprobs(loaded, documents, stride=stride, batch_size=batch_size, impl=impl):
        nll[d] -= np.sum(logprob, dtype=np.float64)
    return nll


def rolling_logprobs(loaded: load.LoadedModel, doc_ids: Sequence[int], stride: int | None = None, *,
                     batch_size: int = DEFAULT_BATCH, impl: str | None = None) -> np.ndarray:
    """[len(doc_ids)] log p of each token of one document as the rolling windows score it."""
    parts = [lp for _, lp in _window_logprobs(loaded, [doc_ids], stride=stride, batch_size=batch_size,
                                              impl=impl)]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def rolling_nll(loaded: load.LoadedModel, doc_ids: Sequence[int], stride: int | None = None, *,
                batch_size: int = DEFAULT_BATCH, impl: str | None = None) -> float:
    """Summed NLL (nats) of one document; see rolling_nlls."""
    return float(rolling_nlls(loaded, [doc_ids], stride=stride, batch_size=batch_size, impl=impl)[0])


# ---------------------------------------------------------------------------------------------
# Perplexity and bits per byte of a token stream.

def split_documents(tokens: np.ndarray, eot: int) -> list[np.ndarray]:
    """The non-empty runs of `tokens` between end-of-text ids (views, no copies)."""
    tokens = np.asarray(tokens)
    eots = np.flatnonzero(tokens == eot)
    starts, ends = np.concatenate([[0], eots + 1]), np.concatenate([eots, [len(tokens)]])
    return [tokens[a:b] for a, b in zip(starts, ends) if b > a]


@dataclasses.dataclass(frozen=True)
class Perplexity:
    documents: int
    tokens: int       # tokens scored (end-of-text separators are context, not scored)
    nll: float        # summed negative log-likelihood, nats
    bytes: int        # UTF-8 bytes of the text scored

    @property
    def loss(self) -> float:
        return self.nll / self.tokens

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    @property
    def bits_per_byte(self) -> float:
        return self.nll / math.log(2) / self.bytes


def score_stream(loaded: load.LoadedModel, tokens: np.ndarray, *, stride: int | None = None,
                 batch_size: int = DEFAULT_BATCH, max_documents: int | None = None,
                 impl: str | None = None) -> Perplexity:
    """Perplexity and bits per byte of a token stream, document by document (split at EOT)."""
    eot = tokenizer_lib.eot_id(loaded.tokenizer)
    documents = split_documents(tokens, eot)[:max_documents]
    if not documents:
        raise DataError("the token stream holds no document to score")
    nll = rolling_nlls(loaded, documents, stride=stride, batch_size=batch_size, impl=impl)
    byte_counts = tokenizer_lib.bytes_per_token(loaded.tokenizer).astype(np.int64)
    return Perplexity(documents=len(documents), tokens=sum(len(d) for d in documents),
                      nll=float(nll.sum()), bytes=int(sum(byte_counts[d].sum() for d in documents)))


# ---------------------------------------------------------------------------------------------
# Log-likelihood of a continuation (lm-eval's loglikelihood).

def encode_pair(tokenizer: Tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval's TemplateLM encodes a causal request: trailing
    spaces of the context move into the continuation, the continuation is what encoding the whole
    adds after the context's own encoding, and an empty context becomes end-of-text."""
    eot = tokenizer_lib.eot_id(tokenizer)
    if context == "":
        cont = tokenizer_lib.encode(tokenizer, continuation)
        return ([eot], cont) if not cont or cont[0] != eot else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = tokenizer_lib.encode(tokenizer, context + continuation)
    ctx = tokenizer_lib.encode(tokenizer, context)
    # A context of spaces only is empty once they move: end-of-text stands in for it.
    return (ctx or [eot]), whole[len(ctx):]


def loglikelihood(loaded: load.LoadedModel, requests: Sequence[tuple[str, str]], *,
                  batch_size: int = DEFAULT_BATCH, impl: str | None = None) -> list[tuple[float, bool]]:
    """(summed log p(continuation | context), every continuation token is the greedy choice) per
    (context, continuation); a context too long for seq_len keeps its last tokens."""
    seq_len = loaded.cfg.model.seq_len
    sequences, n_scored = [], []
    for context, continuation in requests:
        ctx, cont = encode_pair(loaded.tokenizer, context, continuation)
        if len(cont) > seq_len:
            raise ValueError(f"a continuation of {len(cont)} tokens does not fit model.seq_len={seq_len}")
        sequences.append((ctx + cont)[-(seq_len + 1):])
        n_scored.append(len(cont))
    scorable = [i for i, n in enumerate(n_scored) if n]
    scored = token_logprobs(loaded, [sequences[i] for i in scorable], batch_size=batch_size, impl=impl)
    results = [(0.0, True)] * len(requests)  # an empty continuation: probability 1
    for i, (logprob, greedy) in zip(scorable, scored):
        n = n_scored[i]
        results[i] = (float(np.sum(logprob[-n:], dtype=np.float64)), bool(np.all(greedy[-n:])))
    return results


# ---------------------------------------------------------------------------------------------
# Tasks: multiple choice and LAMBADA-style last word.
