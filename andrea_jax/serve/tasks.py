"""Zero-shot tasks, scored as lm-evaluation-harness scores them: multiple choice (acc, acc_norm)
and LAMBADA-style last word (acc, ppl). A task file is JSONL; `read_task` checks every line.
"""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Sequence

import numpy as np

from andrea_jax.config import Config
from andrea_jax.errors import ConfigError, TaskError
from andrea_jax.serve import load
from andrea_jax.serve.scoring import DEFAULT_BATCH, loglikelihood


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


def score_task(loaded: load.LoadedModel, examples, *, batch_size: int = DEFAULT_BATCH,
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


def read_training_tasks(cfg: Config) -> dict:
    """train.eval_tasks: {file stem: examples}, read and checked as `evaluate --task` reads them."""
    paths = [p.strip() for p in cfg.train.eval_tasks.split(",") if p.strip()]
    if not paths:
        return {}
    read = {pathlib.Path(p).stem: read_task(p) for p in paths}
    if len(read) < len(paths):
        raise ConfigError(f"train.eval_tasks: two files share a name ({cfg.train.eval_tasks}); their metrics "
                          f"are logged as task/NAME/...")
    return read


def score_tasks(loaded: load.LoadedModel, tasks: dict) -> dict:
    """{task/NAME/METRIC: value} of the tasks ({name: examples}, as read_training_tasks returns them)
    on a model: the numbers of `evaluate --task`. The in-loop hook of train.eval_tasks (andrea_jax.cli)
    scores them at every evaluation."""
    line = {}
    for name, examples in tasks.items():
        metrics = score_task(loaded, examples)
        line |= {f"task/{name}/{k}": float(v) for k, v in metrics.items() if k not in ("kind", "n")}
    return line
