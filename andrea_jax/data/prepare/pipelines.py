"""The Apache Beam pipelines of `python -m andrea_jax.data.prepare` (driver.py drives them),
two phases, each one pipeline on any runner (Direct, Dask, Flink, Spark, Dataflow):

1. The tokenizer, only when none is given: every document of every unit gets its seeded sample key
   (sampling.py), each unit keeps its --tokenizer-docs smallest, `TopCombineFn` keeps the smallest
   of those, per group of units and then overall (the corpus's smallest are among each unit's), and
   one worker trains the BPE on them and writes OUT/tokenizer.json.
2. The shards: each of the K shards is tokenized by one worker, which loads OUT/tokenizer.json once
   per process (`TokenizeShard.setup`), and written with its index and marker; the markers, gathered
   into one list, make the manifest.

Why two pipelines, a file between them and no side input: Beam's Dask runner recomputes a side
input for each of its consumers, collects a bundle's outputs before `finish_bundle` (so Beam's
`Top.Smallest`, which emits there, loses its output), and computes only the last transform of the
graph. So the tokenizer is trained once and read from its file, every combiner here emits from its
merge, and each pipeline is one chain ending in a transform that needs all of its work (the
tokenizer; the manifest): `ends_in_one_sink` checks the last (tests/test_prepare_dask.py).
"""
from __future__ import annotations

import heapq
import math
from typing import Callable, Iterator, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.combiners import ToListCombineFn, TopCombineFn

from tokenizers import Tokenizer

from andrea_jax.data import sampling, shard_writer, storage, token_cache, token_shards, tokenizer as tokenizer_lib
from andrea_jax.data.prepare import corpus_units
from andrea_jax.errors import DataError

TOKENIZER = "tokenizer.json"
DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"


# ---------------------------------------------------------------------------------------------
# The steps (module functions and classes: pickled to the workers by reference).

def keyed_documents(indexed_unit: tuple, seed: int) -> Iterator[tuple]:
    """(sample key, unit index, document index, text) of every document of a unit. A document's id
    is (file, line) for files, its record index for TFDS: the same whatever the shard count."""
    u, unit = indexed_unit
    for j, text in enumerate(corpus_units.unit_documents(unit)):
        doc = unit[4] + j if unit[0] == "tfds" else sampling.doc_id(u, j)
        yield int(sampling.keys([doc], seed)[0]), u, j, text


def sample_key(entry: tuple) -> int:
    return entry[0]


def unit_sample(indexed_unit: tuple, seed: int, n: int, groups: int) -> Iterator[tuple[int, tuple]]:
    """(the unit's group, entry) of the unit's n documents of smallest key: its candidates for the
    corpus's sample (keys are distinct, splitmix64 being a bijection, so the sample does not depend
    on how the units' candidates are merged)."""
    u = indexed_unit[0]
    for entry in heapq.nsmallest(n, keyed_documents(indexed_unit, seed), key=sample_key):
        yield u % groups, entry


def group_sample(group_and_sample: tuple) -> list[tuple]:
    return group_and_sample[1]


def train_tokenizer(sample: list, vocab_size: int, out: str, corpus_name: str) -> str:
    """The BPE trained on the sampled documents (in corpus order), saved as OUT/tokenizer.json."""
    texts = [text for *_, text in sorted(sample, key=lambda e: (e[1], e[2]))]
    try:
        tok = tokenizer_lib.train(texts, vocab_size)
    except ValueError as e:
        raise DataError(f"corpus {corpus_name}: {e}") from None
    shard_writer.atomic_write_bytes(storage.path(out) / TOKENIZER, tok.to_str().encode())
    return token_cache.tokenizer_hash(tok)


_TOKENIZERS: dict = {}


def load_tokenizer(out: str, tok_hash: str):
    """OUT/tokenizer.json, once per process, refused unless it is the tokenizer `tok_hash`."""
    path = storage.path(out) / TOKENIZER
    if (str(path), tok_hash) not in _TOKENIZERS:
        tok = Tokenizer.from_str(path.read_text())   # a file or a gs:// object
        if token_cache.tokenizer_hash(tok) != tok_hash:
            raise DataError(f"{path} is tokenizer {token_cache.tokenizer_hash(tok)}, not {tok_hash} that this run "
                            f"started with: another run writes to the same --out")
        _TOKENIZERS.clear()
        _TOKENIZERS[(str(path), tok_hash)] = tok
    return _TOKENIZERS[(str(path), tok_hash)]


def shard_label(plan: dict, tok_hash: str, shard: int) -> dict:
    """What made a shard: a marker that says otherwise is not this run's and the shard is redone."""
    return {"source_key": plan["source_key"], "tokenizer": tok_hash, "shard": shard, "shards": plan["shards"]}


def write_shard(shard: int, tok, tok_hash: str, plan: dict) -> dict:
    """Tokenizes shard `shard`'s units into its files, unless a valid marker says it is done."""
    out, count = storage.path(plan["out"]), plan["shards"]
    name = token_shards.shard_file(shard, count)
    label = shard_label(plan, tok_hash, shard)
    done = shard_writer.complete_shard(out, name, label)
    if done is not None:
        return done
    units = [plan["units"][u] for u in plan["assignment"][shard]]
    texts = (text for unit in units for text in corpus_units.unit_documents(unit))
    return shard_writer.write_shard(out, name, token_cache.encode_stream(tok, texts),
                                    token_cache.token_dtype(tok.get_vocab_size()), label)


class TokenizeShard(beam.DoFn):
    """Shard index -> its marker, the tokenizer read from OUT once per worker process."""

    def __init__(self, plan: dict, tok_hash: str):
        self.plan, self.tok_hash = plan, tok_hash

    def setup(self):
        self.tok = load_tokenizer(self.plan["out"], self.tok_hash)

    def process(self, shard: int):
        yield write_shard(shard, self.tok, self.tok_hash, self.plan)


def write_manifest(markers: list, plan: dict, tok_hash: str, vocab_size: int) -> dict:
    if sum(m["documents"] for m in markers) == 0:
        raise DataError(f"corpus {plan['name']} is empty")
    return shard_writer.write_manifest(plan["out"], markers, source=plan["name"], source_key=plan["source_key"],
                                       tokenizer=tok_hash, vocab_size=vocab_size)


# ---------------------------------------------------------------------------------------------
# The two graphs, and running one.

def tokenizer_graph(p: beam.Pipeline, plan: dict, seed: int, n_docs: int, vocab_size: int):
    """Phase 1: the sample and the tokenizer trained on it (nothing when the corpus is empty). The
    units' candidates are merged in two levels, about sqrt(units) groups of units and then the
    groups' samples, so that no merge holds more than about sqrt(units) x n_docs documents: Dask
    combines without Beam's combiner lifting (the DirectRunner's partial combines per bundle), so
    one merge of every unit's candidates would hold units x n_docs."""
    groups = max(1, math.isqrt(len(plan["units"])))
    top = TopCombineFn(n_docs, key=sample_key, reverse=True)
    return (p | "Units" >> beam.Create(list(enumerate(plan["units"])))
            | "SpreadUnits" >> beam.Reshuffle()
            | "SampleUnits" >> beam.FlatMap(unit_sample, seed, n_docs, groups)
            | "SampleGroups" >> beam.CombinePerKey(top)
            | "GroupSamples" >> beam.FlatMap(group_sample)
            | "Sample" >> beam.CombineGlobally(top).without_defaults()
            | "TrainTokenizer" >> beam.Map(train_tokenizer, vocab_size, plan["out"], plan["name"]))


def shards_graph(p: beam.Pipeline, plan: dict, tok_hash: str, vocab_size: int):
    """Phase 2: the K shards, then the manifest from all their markers."""
    markers = (p | "Shards" >> beam.Create(list(range(plan["shards"])))
               | "SpreadShards" >> beam.Reshuffle()
               | "Tokenize" >> beam.ParDo(TokenizeShard(plan, tok_hash)))
    return (markers | "All" >> beam.CombineGlobally(ToListCombineFn()).without_defaults()
            | "Manifest" >> beam.Map(write_manifest, plan, tok_hash, vocab_size))


def beam_options(runner: str, workers: int, extra: Sequence[str], scheduler: str | None = None) -> list[str]:
    """Beam's options for `runner` (its Beam name, driver.RUNNERS), then `extra` (after --)."""
    args = [f"--runner={runner}"]
    if runner == "DirectRunner" and workers == 1:  # in this process: no worker to start, nothing to pickle
        args += ["--direct_running_mode=in_memory"]
    elif runner == "DirectRunner":
        args += ["--direct_running_mode=multi_processing",
                 f"--direct_num_workers={workers}", "--default_sdk_harness_log_level=WARNING"]
    if runner == DASK_RUNNER:
        args.append(f"--dask_client_address={scheduler}")
        # Beam's Create makes one Dask partition of up to 128 elements, run by one worker: one
        # element per partition spreads the K shards (and the units) over all the workers.
        if not any(a.startswith(("--dask_partition_size", "--dask_npartitions")) for a in extra):
            args.append("--dask_partition_size=1")
    return args + list(extra)


def run(graph: Callable[[beam.Pipeline], object], options: Sequence[str]) -> None:
    """Builds the pipeline with `graph` and runs it to the end (closing the Dask runner's client)."""
    p = beam.Pipeline(options=PipelineOptions(list(options)))
    graph(p)
    result = p.run()
    try:
        result.wait_until_finish()
    finally:
        client = getattr(result, "client", None)   # the Dask runner's, which it leaves open
        if client is not None:
            client.close()


def ends_in_one_sink(p: beam.Pipeline) -> list[str]:
    """The leaf transforms that the pipeline's last one does not depend on (should be none): a
    runner that computes only the last transform (Dask) would skip them."""

    class Leaves(beam.pipeline.PipelineVisitor):
        def __init__(self):
            self.order: list = []

        def visit_transform(self, node):
            self.order.append(node)

    leaves = Leaves()
    p.visit(leaves)
    needed, todo = set(), [leaves.order[-1]]
    while todo:
        node = todo.pop()
        if node in needed:
            continue
        needed.add(node)
        todo += [pc.producer for pc in node.inputs if getattr(pc, "producer", None) is not None]
        todo += [si.pvalue.producer for si in node.side_inputs]
    return [node.full_label for node in leaves.order if node not in needed]
