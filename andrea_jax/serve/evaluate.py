"""Evaluating a trained model: perplexity and bits per byte of its data, and small zero-shot tasks.

    andrea-evaluate (--workdir DIR [--step N] | --export OUT) [--set data.KEY=VALUE ...]
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

if __name__ == "__main__":  # python -m andrea_jax.serve.evaluate: jax starts as the console scripts start
    from andrea_jax import startup  # it (andrea_jax/commands.py), before the imports below import it
    startup.start_jax()

import argparse
import dataclasses
import pathlib
import sys
import tempfile
from typing import Sequence

import numpy as np

from andrea_jax import config as config_lib, signals
from andrea_jax.errors import AndreaError
from andrea_jax.serve import load
from andrea_jax.serve.scoring import DEFAULT_BATCH, Perplexity, score_stream
from andrea_jax.serve.tasks import read_task, score_task


def check_data_overrides(assignments: Sequence[str]) -> None:
    """Only the data may change: the model is the run's."""
    for assignment in assignments:
        if not assignment.startswith("data."):
            raise config_lib.ConfigError(f"--set {assignment!r}: only data.* keys can be changed; the "
                                         f"model is the run's")


def data_tokens(loaded: load.LoadedModel, data_overrides: Sequence[str] = (), split: str = "val"
                ) -> np.ndarray:
    """The `split` token stream of the run's data (its saved `data` config with `data.*` overrides),
    tokenized with the model's own tokenizer."""
    from andrea_jax.data import pipeline  # the data stack (TFDS) loads only for perplexity

    if split not in ("val", "train"):
        raise ValueError(f"split must be val or train, got {split!r}")
    check_data_overrides(data_overrides)
    cfg = config_lib.override(loaded.cfg, data_overrides)
    with tempfile.TemporaryDirectory() as tmp:
        tok_file = pathlib.Path(tmp) / load.TOKENIZER
        loaded.tokenizer.save(str(tok_file))
        # Always the model's own BPE: with data.tokenizer empty, tokenized_corpus() would train a new one.
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, tokenizer=str(tok_file)))
        config_lib.validate(cfg)
        corpus = pipeline.tokenized_corpus(cfg.data, vocab_size=cfg.model.vocab_size, seq_len=cfg.model.seq_len)
    return corpus.train_tokens if split == "train" else corpus.val_tokens


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


@signals.command  # a second SIGINT or SIGTERM stops the process at once, whatever it is doing
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="andrea-evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    load.add_source_args(parser)
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
        loaded = load.load_from_args(args)
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
    except AndreaError as e:  # a config (exit 2), load, data or task error
        print(f"{'config error' if isinstance(e, config_lib.ConfigError) else 'error'}: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
