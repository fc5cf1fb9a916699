"""What diagnostics.knockout and train.eval_tasks add to an evaluation, on random parameters of a
config, as a fraction of the evaluation itself (train.eval_batches batches of the eval step).

    python benchmarks/eval_extras.py --config tiny
    python benchmarks/eval_extras.py --config andrea_120m --batch 2 --eval-batches 2

The evaluation, the knockout pass and the task scoring each run once to compile and warm up, then
--repeats times; the median is reported. Knockout runs L forward passes per batch (one vmapped
call, or --knockout-chunks C: lax.map over vmapped chunks of C masks), so expect about L times the
evaluation. Task scoring runs the two shipped task files
(tasks/*.jsonl) through the code of `evaluate --task`; its cost depends on the tasks, not on the
validation set. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from andrea_jax import config as config_lib, configs, model as model_lib  # noqa: E402
from andrea_jax.data import pipeline, tokenizer as tokenizer_lib  # noqa: E402
from andrea_jax.serve import load, tasks as tasks_lib  # noqa: E402
from andrea_jax.train import steps  # noqa: E402

TASKS = [ROOT / "tasks" / "shakespeare_mc.jsonl", ROOT / "tasks" / "shakespeare_lambada.jsonl"]


def timed(fn, repeats: int) -> float:
    fn()  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--batch", type=int, default=None, help="rows per validation batch (default: train.batch_size)")
    parser.add_argument("--eval-batches", type=int, default=None, help="default: train.eval_batches")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--knockout-chunks", default="0",
                        help="comma-separated diagnostics.knockout_chunk values to time (0: all L masks in one pass)")
    args = parser.parse_args(argv)
    cfg = configs.load(args.config)
    sets = [f"train.batch_size={args.batch}"] if args.batch else []
    sets += [f"train.eval_batches={args.eval_batches}"] if args.eval_batches else []
    cfg = config_lib.validate(config_lib.override(cfg, [*sets, "prores.schedule=linear"]))
    mesh = steps.make_mesh(cfg)
    params = model_lib.init(cfg.model, jax.random.key(0))["params"]
    tok = tokenizer_lib.train([pipeline.read_text(pipeline.EMBEDDED_CORPUS)[:200_000]], cfg.model.vocab_size)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, cfg.model.vocab_size, (cfg.train.batch_size, cfg.model.seq_len + 1), dtype=np.int32)
               for _ in range(cfg.train.eval_batches)]
    step = jax.numpy.int32(cfg.prores.warmup)  # mid-warmup: every alpha in (0, 1]
    bytes_V = jax.numpy.asarray(tokenizer_lib.bytes_per_token(tok))
    eval_step = steps.make_eval_step(cfg, mesh)
    evaluation = timed(lambda: steps.evaluate(eval_step, params, step, batches, bytes_V)["val_loss"], args.repeats)
    knockout_by_chunk = {}
    for chunk in [int(c) for c in args.knockout_chunks.split(",")]:
        chunked = dataclasses.replace(cfg, diagnostics=dataclasses.replace(cfg.diagnostics, knockout_chunk=chunk))
        knockout_step = steps.make_knockout_step(chunked, mesh)
        knockout_by_chunk[chunk] = timed(lambda: steps.knockout(knockout_step, params, step, batches, 0.0),
                                         args.repeats)
    knockout = knockout_by_chunk.get(cfg.diagnostics.knockout_chunk, next(iter(knockout_by_chunk.values())))
    loaded = load.LoadedModel(cfg, params, tok, int(step), "random")
    examples = [tasks_lib.read_task(p) for p in TASKS]
    scoring = timed(lambda: [tasks_lib.score_task(loaded, e) for e in examples], args.repeats)
    print(json.dumps({
        "config": args.config, "backend": jax.default_backend(), "n_layer": cfg.model.n_layer,
        "eval_batches": cfg.train.eval_batches, "batch": cfg.train.batch_size, "seq_len": cfg.model.seq_len,
        "evaluation_s": round(evaluation, 4), "knockout_s": round(knockout, 4),
        "knockout_over_evaluation": round(knockout / evaluation, 2),
        "knockout_s_by_chunk": {str(c): round(t, 4) for c, t in knockout_by_chunk.items()},
        "knockout_over_evaluation_by_chunk": {str(c): round(t / evaluation, 2) for c, t in knockout_by_chunk.items()},
        "eval_tasks_s": round(scoring, 4),
        "eval_tasks_over_evaluation": round(scoring / evaluation, 2),
        "task_examples": sum(len(e) for e in examples)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
