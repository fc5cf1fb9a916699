"""Evaluating a trained model: perplexity and bits per byte of its data, and small zero-shot tasks.

    python -m andrea_jax.evaluate (--workdir DIR [--step N] | --export OUT) [--set data.KEY=VALUE ...]
        [--split val|train] [--stride S] [--batch-size B] [--max-documents N] [--task FILE.jsonl ...]

Perplexity (the default) is measured on the token stream of the data the run was trained on: the
run's saved `data` config with `--set data.*` changes, always tokenized with the model's own BPE
(never a retrained one). The stream is cut into documents at <|endoftext|>, and each document is
scored whole, the way lm-evaluation-harness scores `loglikelihood_rolling`: its first token is
predicted from an end-of-text context, windows hold at most model.seq_len tokens, and each window
scores only tokens no earlier window scored. With the default stride (= seq_len) the windows are
disjoint; a smaller --stride scores `stride` new tokens per window, so each sees up to
seq_len - stride more tokens of earlier context (slower, a truer measure of the model).

Bits per byte is the summed NLL / ln 2 / the UTF-8 bytes of the text scored, which compares models
with different tokenizers. Where the validation split is the tail of the training stream (no
separate validation split), its first document usually begins mid-document: a single-file corpus
such as the embedded tinyshakespeare is one document, so its val split is that document's last
part, scored as if it began a document. Its bytes are counted from the tokens, so that is exact.

Tasks (--task FILE.jsonl), scored as lm-evaluation-harness scores them zero-shot:
  * multiple choice, lines {"context": str, "choices": [str, ...], "label": int}: each choice is
    scored as loglikelihood(context, " " + choice); acc takes the argmax of the summed
    log-likelihoods, acc_norm of the log-likelihood per character of the choice;
  * LAMBADA-style, lines {"text": str}: the last word (after the last space) is predicted from the
    rest; acc counts targets whose every token is the greedy choice, ppl = exp(-mean summed ll).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import pathlib
import sys
import tempfile
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tokenizers import Tokenizer

from andrea_jax import config as config_lib, inference
from andrea_jax.data import tokenizer as tokenizer_lib
from andrea_jax.data.errors import DataError

DEFAULT_BATCH = 32
MIN_BUCKET = 16            # shortest padded length: a few compilations serve every request length
WINDOWS_PER_CHUNK = 1024   # rolling windows held in memory at once, however long the corpus


# ---------------------------------------------------------------------------------------------
# Scoring tokens: the one jitted function everything below goes through.

_LOGPROB_FNS: dict = {}


def _logprob_fn(loaded: inference.LoadedModel, impl: str | None):
    """jit(params, alphas_L, tokens_BT, targets_BT) -> (log p(target) [B,T], target is argmax [B,T]).

    Params and alphas are arguments, not constants, so one compilation serves every checkpoint of
    a model shape; one function per (model config, kernel impl)."""
    model = loaded.model(impl)
    key = (loaded.cfg.model, model.impl)
    if key not in _LOGPROB_FNS:
        def logprobs(params, alphas_L, tokens_BT, targets_BT):
            logits_BTV = model.apply({"params": params}, tokens_BT, alphas_L).astype(jnp.float32)
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


def token_logprobs(loaded: inference.LoadedModel, sequences: Sequence[Sequence[int]], *,
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
        logprob_BT, greedy_BT = np.asarray(logprob_BT), np.asarray(greedy_BT)
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


def rolling_nlls(loaded: inference.LoadedModel, documents: Sequence[Sequence[int]], *,
                 stride: int | None = None, batch_size: int = DEFAULT_BATCH,
                 impl: str | None = None) -> np.ndarray:
    """[len(documents)] summed NLL (nats) of each document, every token scored once (see
    rolling_windows), the first from an end-of-text context: lm-eval's loglikelihood_rolling."""
    nll = np.zeros(len(documents), np.float64)
    for d, logprob in _window_logprobs(loaded, documents, stride=stride, batch_size=batch_size, impl=impl):
        nll[d] -= np.sum(logprob, dtype=np.float64)
    return nll


def rolling_logprobs(loaded: inference.LoadedModel, doc_ids: Sequence[int], stride: int | None = None, *,
                     batch_size: int = DEFAULT_BATCH, impl: str | None = None) -> np.ndarray:
    """[len(doc_ids)] log p of each token of one document as the rolling windows score it."""
    parts = [lp for _, lp in _window_logprobs(loaded, [doc_ids], stride=stride, batch_size=batch_size,
                                              impl=impl)]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def rolling_nll(loaded: inference.LoadedModel, doc_ids: Sequence[int], stride: int | None = None, *,
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


def score_stream(loaded: inference.LoadedModel, tokens: np.ndarray, *, stride: int | None = None,
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


def check_data_overrides(assignments: Sequence[str]) -> None:
    """Only the data may change: the model is the run's."""
    for assignment in assignments:
        if not assignment.startswith("data."):
            raise config_lib.ConfigError(f"--set {assignment!r}: only data.* keys can be changed; the "
                                         f"model is the run's")


def data_tokens(loaded: inference.LoadedModel, data_overrides: Sequence[str] = (), split: str = "val"
                ) -> np.ndarray:
    """The `split` token stream of the run's data (its saved `data` config with `data.*` overrides),
    tokenized with the model's own tokenizer."""
    from andrea_jax.data import pipeline  # the data stack (TFDS) loads only for perplexity

    if split not in ("val", "train"):
        raise ValueError(f"split must be val or train, got {split!r}")
    check_data_overrides(data_overrides)
    cfg = config_lib.override(loaded.cfg, data_overrides)
    with tempfile.TemporaryDirectory() as tmp:
        tok_file = pathlib.Path(tmp) / inference.TOKENIZER
        loaded.tokenizer.save(str(tok_file))
        # Always the model's own BPE: with data.tokenizer empty, prepare() would train a new one.
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, tokenizer=str(tok_file)))
        config_lib.validate(cfg)
        corpus = pipeline.prepare(cfg.data, vocab_size=cfg.model.vocab_size, seq_len=cfg.model.seq_len)
    return corpus.train_tokens if split == "train" else corpus.val_tokens


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


def loglikelihood(loaded: inference.LoadedModel, requests: Sequence[tuple[str, str]], *,
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

class TaskError(ValueError):
    """A bad task file: the one-line message names the file and line."""


@dataclasses.dataclass(frozen=True)
class ChoiceExample:
    context: str
    choices: tuple[str, ...]
    label: int

    def requests(self) -> list[tuple[str, str]]:
        return [(self.context, " " + choice) for choice in self.choices]


@dataclasses.dataclass(frozen=True)
class LastWordExample:
    context: str      # the text before its last space
    target: str       # " " + the last word

    @classmethod
    def from_text(cls, text: str) -> "LastWordExample":
        context, _, word = text.rpartition(" ")
        return cls(context, " " + word)


def _example(record, where: str):
    if not isinstance(record, dict):
        raise TaskError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "choices" in record or "label" in record:
        context, choices, label = record.get("context"), record.get("choices"), record.get("label")
        if not isinstance(context, str):
            raise TaskError(f"{where}: a multiple-choice line needs a string 'context'")
        if not (isinstance(choices, list) and len(choices) >= 2 and all(isinstance(c, str) and c for c in choices)):
            raise TaskError(f"{where}: 'choices' must be a list of at least 2 non-empty strings")
        if not (isinstance(label, int) and not isinstance(label, bool) and 0 <= label < len(choices)):
            raise TaskError(f"{where}: 'label' must be an index into the {len(choices)} choices, got {label!r}")
        return ChoiceExample(context, tuple(choices), label)
    if "text" in record:
        text = record["text"]
        if not isinstance(text, str) or " " not in text.strip() or text != text.rstrip():
            raise TaskError(f"{where}: 'text' must be a string of several words whose last word ends it")
        return LastWordExample.from_text(text)
    keys = ", ".join(record) or "nothing"
    raise TaskError(f"{where}: neither multiple choice (context, choices, label) nor LAMBADA-style "
                    f"(text); the line has: {keys}")


def read_task(path) -> list[ChoiceExample] | list[LastWordExample]:
    """The examples of a .jsonl task file, all of one kind (told apart by their fields)."""
    path = pathlib.Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"{path}: cannot be read ({e})") from None
    examples = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path} line {lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskError(f"{where}: not valid JSON ({e.msg})") from None
        example = _example(record, where)
        if examples and type(example) is not type(examples[0]):
            raise TaskError(f"{where}: mixes multiple-choice and LAMBADA-style lines in one file")
        examples.append(example)
    if not examples:
        raise TaskError(f"{path}: holds no examples")
    return examples


def multiple_choice_metrics(examples: Sequence[ChoiceExample], lls: Sequence[Sequence[float]]) -> dict:
    """acc: argmax of summed log-likelihoods; acc_norm: argmax of ll / characters of the choice
    (lm-eval's length normalisation; ties go to the first choice, as np.argmax)."""
    acc = [int(np.argmax(ll)) == ex.label for ex, ll in zip(examples, lls)]
    acc_norm = [int(np.argmax(np.asarray(ll) / [len(c) for c in ex.choices])) == ex.label
                for ex, ll in zip(examples, lls)]
    return {"acc": float(np.mean(acc)), "acc_norm": float(np.mean(acc_norm)), "n": len(examples)}


def last_word_metrics(results: Sequence[tuple[float, bool]]) -> dict:
    """acc: share of targets predicted greedily token by token; ppl: exp(-mean summed ll)."""
    return {"acc": float(np.mean([greedy for _, greedy in results])),
            "ppl": math.exp(-float(np.mean([ll for ll, _ in results]))), "n": len(results)}


def score_task(loaded: inference.LoadedModel, examples, *, batch_size: int = DEFAULT_BATCH,
               impl: str | None = None) -> dict:
    """The metrics of a task's examples (see multiple_choice_metrics / last_word_metrics)."""
    if isinstance(examples[0], ChoiceExample):
        flat = loglikelihood(loaded, [r for ex in examples for r in ex.requests()], batch_size=batch_size,
                             impl=impl)
        bounds = np.cumsum([0] + [len(ex.choices) for ex in examples])
        lls = [[ll for ll, _ in flat[a:b]] for a, b in zip(bounds[:-1], bounds[1:])]
        return {"kind": "multiple choice", **multiple_choice_metrics(examples, lls)}
    results = loglikelihood(loaded, [(ex.context, ex.target) for ex in examples], batch_size=batch_size,
                            impl=impl)
    return {"kind": "last word", **last_word_metrics(results)}


# ---------------------------------------------------------------------------------------------
# Command line.

def describe_data(data_cfg) -> str:
    if data_cfg.source == "files":
        return f"files {data_cfg.path}"
    if data_cfg.source == "tfds":
        return f"tfds {data_cfg.tfds_name}"
    if data_cfg.source == "prepared":
        return f"prepared dataset {data_cfg.path}"
    return "embedded tinyshakespeare"


def format_perplexity(result: Perplexity) -> str:
    return (f"{result.documents:,} document(s), {result.tokens:,} tokens, {result.bytes:,} bytes: "
            f"loss {result.loss:.4f} nats/token, perplexity {result.perplexity:.4f}, "
            f"bits per byte {result.bits_per_byte:.4f}")


def format_task(path, metrics: dict) -> str:
    names = ("acc", "acc_norm") if metrics["kind"] == "multiple choice" else ("acc", "ppl")
    values = ", ".join(f"{name} {metrics[name]:.4f}" for name in names)
    return f"{path} ({metrics['kind']}, {metrics['n']} examples): {values}"


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m andrea_jax.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    inference.add_source_args(parser)
    parser.add_argument("--set", action="append", default=[], metavar="data.KEY=VALUE",
                        help="change one field of the run's data config (as in training); repeatable")
    parser.add_argument("--split", choices=("val", "train"), default="val", help="the token stream scored")
    parser.add_argument("--stride", type=_positive, help="new tokens scored per window (default seq_len)")
    parser.add_argument("--batch-size", type=_positive, default=DEFAULT_BATCH, help="windows per forward pass")
    parser.add_argument("--max-documents", type=_positive, help="score only the first N documents")
    parser.add_argument("--task", action="append", default=[], metavar="FILE.jsonl",
                        help="score a multiple-choice or LAMBADA-style task file instead; repeatable")
    args = parser.parse_args(argv)
    try:
        check_data_overrides(args.set)
        tasks = [(path, read_task(path)) for path in args.task]  # a bad file fails before any work
        loaded = inference.load_from_args(args)
        seq_len = loaded.cfg.model.seq_len
        if args.stride is not None and args.stride > seq_len:
            parser.error(f"--stride {args.stride} exceeds model.seq_len={seq_len}")
        print(f"model: step {loaded.step} from {loaded.source}", flush=True)
        for path, examples in tasks:
            print(format_task(path, score_task(loaded, examples, batch_size=args.batch_size)), flush=True)
        if not tasks:
            tokens = data_tokens(loaded, args.set, args.split)
            cfg = config_lib.override(loaded.cfg, args.set)
            result = score_stream(loaded, tokens, stride=args.stride, batch_size=args.batch_size,
                                  max_documents=args.max_documents)
            print(f"{args.split} split of {describe_data(cfg.data)} (stride {args.stride or seq_len}): "
                  f"{format_perplexity(result)}", flush=True)
    except config_lib.ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except (inference.LoadError, DataError, TaskError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
