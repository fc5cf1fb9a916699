"""Datasets of the project's task files for lm-evaluation-harness (`custom_dataset` in the YAMLs).

They read the .jsonl files beside this folder, so a task works from any working directory and
without network (no Hugging Face hub, no datasets cache).
"""
import json
import pathlib

import datasets

TASKS = pathlib.Path(__file__).resolve().parent.parent


def _jsonl(name: str, **_metadata) -> datasets.DatasetDict:
    lines = (TASKS / name).read_text(encoding="utf-8").splitlines()
    return datasets.DatasetDict({"test": datasets.Dataset.from_list([json.loads(l) for l in lines if l.strip()])})


def shakespeare_mc(**metadata) -> datasets.DatasetDict:
    return _jsonl("shakespeare_mc.jsonl", **metadata)


def shakespeare_lambada(**metadata) -> datasets.DatasetDict:
    return _jsonl("shakespeare_lambada.jsonl", **metadata)
