"""data.mixture: prepared datasets mixed in proportion to their weights, deterministic given the
seed, resumable mid-mixture, split per process, each source's tokens counted; bad entries refused.

Each tiny dataset's tokens are SOURCE * 10000 + position, so every row of a batch says which
dataset it came from, and where.
"""
import dataclasses
import json
import shutil

import numpy as np
import pytest
from scipy import stats

from andrea_jax import config as config_lib
from andrea_jax.config import Config, ConfigError
from andrea_jax.data import mixture, pipeline, shard_writer, token_cache, token_shards, tokenizer as tokenizer_lib
from andrea_jax.errors import DataError

SEQ_LEN, BATCH = 4, 8
SIZES = (2001, 1201, 801)   # tokens of each dataset
WEIGHTS = (5.0, 3.0, 2.0)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture")
    tok = tokenizer_lib.train(["to be or not to be, that is the question"] * 20, vocab_size=270)
    folders = []
    for s, size in enumerate(SIZES):
        folder = root / f"ds{s}"
        folder.mkdir()
        ids = (s * 10000 + np.arange(size)).astype(np.uint16)
        lengths = np.diff([0, *range(97, size, 97), size])
        marker = shard_writer.write_shard(folder, token_shards.shard_file(0, 1), [(ids, lengths)], np.uint16,
                                          {"tokenizer": token_cache.tokenizer_hash(tok)})
        shard_writer.write_manifest(folder, [marker], tokenizer=token_cache.tokenizer_hash(tok))
        tok.save(str(folder / "tokenizer.json"))
        folders.append(folder)
    return folders, tok.get_vocab_size()


def make_cfg(datasets, weights=WEIGHTS, seed=0, **data):
    folders, vocab = datasets
    spec = ",".join(f"{f}:{w:g}" for f, w in zip(folders, weights))
    cfg = Config()
    return dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, source="prepared", mixture=spec, val_fraction=0.1, **data),
        model=dataclasses.replace(cfg.model, vocab_size=vocab, seq_len=SEQ_LEN),
        train=dataclasses.replace(cfg.train, batch_size=BATCH, seed=seed))


def build(cfg, tmp_path, process_index=0, process_count=1):
    return pipeline.build(cfg, cache_dir=tmp_path / "cache", process_index=process_index,
                          process_count=process_count)


def test_over_1000_batches_each_source_lies_within_binomial_99_9_percent_bounds(datasets, tmp_path):
    corpus, batches, _ = build(make_cfg(datasets), tmp_path)
    rows = np.concatenate([next(batches) for _ in range(1000)])
    n = len(rows)
    sources = rows[:, 0] // 10000
    counts = np.bincount(sources, minlength=len(SIZES))
    for s, w in enumerate(np.asarray(WEIGHTS) / sum(WEIGHTS)):
        lo, hi = stats.binom.ppf([0.0005, 0.9995], n, w)
        assert lo <= counts[s] <= hi, (s, counts[s], lo, hi)
    # Each row is one window of its own dataset, consecutive tokens.
    np.testing.assert_array_equal(np.diff(rows, axis=1), 1)
    # The metric's closed-form count is what the stream gave.
    seen = pipeline.tokens_by_source(make_cfg(datasets), corpus, 1000)
    assert seen == {f"tokens/ds{s}": int(c) * SEQ_LEN for s, c in enumerate(counts)}


def test_a_batch_of_one_reads_the_same_mixture_a_window_at_a_time(datasets, tmp_path):
    cfg = make_cfg(datasets)
    one = build(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=1)), tmp_path)[1]
    by_batch = build(cfg, tmp_path)[1]
    np.testing.assert_array_equal(np.concatenate([next(one) for _ in range(3 * BATCH)]),
                                  np.concatenate([next(by_batch) for _ in range(3)]))


def test_source_counts_match_grains_interleaving_at_every_prefix():
    weights = (0.45, 0.35, 0.2)
    streams = [mixture.grain.MapDataset.range(10**6).map(lambda w, s=s: s) for s in range(3)]
    mixed = mixture.grain.MapDataset.mix(streams, mixture.int_proportions(weights))
    chosen = np.array([mixed[k] for k in range(3000)])
    for n in (0, 1, 7, 100, 999, 3000):
        assert mixture.source_counts(n, weights) == np.bincount(chosen[:n], minlength=3).tolist()


def test_the_mixture_is_deterministic_given_the_seed(datasets, tmp_path):
    def first_batches(seed):
        batches = build(make_cfg(datasets, seed=seed), tmp_path)[1]
        return np.stack([next(batches) for _ in range(20)])

    np.testing.assert_array_equal(first_batches(0), first_batches(0))
    assert not np.array_equal(first_batches(0), first_batches(1))


def test_a_resume_mid_mixture_gives_the_uninterrupted_batches(datasets, tmp_path):
    cfg = make_cfg(datasets)
    corpus, batches, _ = build(cfg, tmp_path)
    straight = [next(batches) for _ in range(30)]
    corpus, batches, _ = build(cfg, tmp_path)
    for _ in range(13):
        next(batches)
    state = pipeline.get_state(batches, cfg, corpus)
    corpus, resumed, _ = build(cfg, tmp_path)
    pipeline.set_state(resumed, cfg, corpus, state)
    np.testing.assert_array_equal(np.stack([next(resumed) for _ in range(17)]), np.stack(straight[13:]))
    # Two processes after the resume read the two halves of the same global batches.
    halves = []
    for p in range(2):
        corpus, part, _ = build(cfg, tmp_path, process_index=p, process_count=2)
        pipeline.set_state(part, cfg, corpus, state)
        halves.append(np.stack([next(part) for _ in range(17)]))
    np.testing.assert_array_equal(np.concatenate(halves, axis=1), np.stack(straight[13:]))
    other = make_cfg(datasets, weights=(1, 1, 1))
    corpus, moved, _ = build(other, tmp_path)
    with pytest.raises(DataError, match="belongs to other data"):
        pipeline.set_state(moved, other, corpus, state)


@pytest.mark.parametrize("spec, named", [
    ("{0}:0.5,{1}:heavy", "{1}:heavy"), ("{0}:0.5,{1}:0", "{1}:0"), ("{0}:-1", "{0}:-1"), ("{0}", "{0}")])
def test_a_bad_weight_is_one_line_naming_the_entry(datasets, spec, named):
    folders = [str(f) for f in datasets[0]]
    cfg = config_lib.override(Config(), ["data.source=prepared", f"data.mixture={spec.format(*folders)}"])
    with pytest.raises(ConfigError) as err:
        config_lib.validate(cfg)
    message = str(err.value)
    assert "\n" not in message and message.startswith("data.mixture:") and named.format(*folders) in message


def test_a_bad_path_is_one_line_naming_the_entry(datasets, tmp_path):
    cfg = make_cfg(datasets)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(
        cfg.data, mixture=cfg.data.mixture + f",{tmp_path / 'nowhere'}:1"))
    config_lib.validate(cfg)
    with pytest.raises(DataError) as err:
        build(cfg, tmp_path)
    message = str(err.value)
    assert "\n" not in message and f"data.mixture entry '{tmp_path / 'nowhere'}': no prepared" in message


def test_mixture_only_with_prepared_and_not_with_data_path(datasets):
    for extra, key in ((["data.source=embedded"], "data.mixture"), (["data.path=/x"], "data.path")):
        cfg = config_lib.override(Config(), ["data.source=prepared", f"data.mixture={datasets[0][0]}:1", *extra])
        with pytest.raises(ConfigError, match=f"^{key}:"):
            config_lib.validate(cfg)


def test_a_dataset_of_another_tokenizer_is_one_line_naming_the_entry(datasets, tmp_path):
    other = tokenizer_lib.train(["all the world's a stage, and all the men and women merely players"] * 20,
                                vocab_size=datasets[1])
    folder = tmp_path / "other"
    folder.mkdir()
    label = {"tokenizer": token_cache.tokenizer_hash(other)}
    marker = shard_writer.write_shard(folder, token_shards.shard_file(0, 1),
                                      [(np.arange(500, dtype=np.uint16), np.array([500]))], np.uint16, label)
    shard_writer.write_manifest(folder, [marker], **label)
    other.save(str(folder / "tokenizer.json"))
    cfg = make_cfg(datasets)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, mixture=cfg.data.mixture + f",{folder}:1"))
    with pytest.raises(DataError) as err:
        build(cfg, tmp_path)
    assert "\n" not in str(err.value) and f"data.mixture entry {folder}: tokenized by another" in str(err.value)


def test_the_step_line_carries_each_sources_tokens_so_far(datasets, tmp_path):
    import time
    from types import SimpleNamespace

    from andrea_jax.train import hooks

    cfg = make_cfg(datasets)
    corpus, batches, _ = build(cfg, tmp_path)
    rows = np.concatenate([next(batches) for _ in range(7)])
    counts = np.bincount(rows[:, 0] // 10000, minlength=len(SIZES))
    ctx = SimpleNamespace(cfg=cfg, corpus=corpus, peak_flops=0)
    state = SimpleNamespace(step_metrics={"loss": 1.0}, last_step=6, last_time=time.perf_counter() - 1,
                            train=SimpleNamespace(opt_state=()))
    line = hooks.step_line(ctx, state, 7, {})
    assert {k: v for k, v in line.items() if k.startswith("tokens/")} == {
        f"tokens/ds{s}": int(c) * SEQ_LEN for s, c in enumerate(counts)}


def test_sources_are_named_by_their_folder_and_shuffled_apart():
    assert mixture.source_names(["gs://b/web/", "data/x/code", "other/code"]) == ("web", "code_1", "code_2")
    # two sources of the same length: each its own permutation of its windows
    parts = (np.arange(41), np.arange(41) + 1000)   # 10 windows of 4 + 1 tokens each
    mix = mixture.Mixture(names=("a", "b"), weights=(0.5, 0.5), train_parts=parts)
    data = mixture.train_dataset(mix, seq_len=4, global_batch=2, seed=0)
    rows = np.concatenate([data[k] for k in range(10)])
    order = {s: [int(r[0] - 1000 * s) // 4 for r in rows if (r[0] >= 1000) == s] for s in (0, 1)}
    assert sorted(order[0]) == sorted(order[1]) == list(range(10)) and order[0] != order[1]
    short = mixture.Mixture(names=("a", "tiny"), weights=(0.5, 0.5), train_parts=(parts[0], np.arange(4)))
    with pytest.raises(DataError, match=r"^data.mixture source tiny: its training part has 4 tokens, fewer than one "
                                        r"window of model.seq_len \+ 1 = 5$"):
        mixture.train_dataset(short, seq_len=4, global_batch=2, seed=0)


def test_the_corpus_counts_every_source_and_validates_on_the_first(datasets, tmp_path):
    cfg = make_cfg(datasets)
    corpus = pipeline.tokenized_corpus(cfg.data, vocab_size=cfg.model.vocab_size, seq_len=SEQ_LEN,
                                       cache_dir=tmp_path / "cache")
    n_train = sum(size - int(size * 0.1) for size in SIZES)
    assert corpus.n_train == n_train == 3603
    assert corpus.train_size == "3,603 training tokens of 3 mixed datasets"
    assert pipeline.fingerprint(cfg, corpus)["n_tokens"] == n_train
    np.testing.assert_array_equal(corpus.val_tokens, np.arange(2001 - 200, 2001))   # the first's tail


def test_only_the_first_source_needs_a_validation_window(datasets, tmp_path):
    folders, vocab = datasets
    data = lambda order: make_cfg(([folders[i] for i in order], vocab), weights=(1.0, 1.0, 1.0)).data
    # Held out: 200, 120 and 80 tokens. A window of 101 fits the first's alone.
    corpus = pipeline.tokenized_corpus(data((0, 1, 2)), vocab_size=vocab, seq_len=100, cache_dir=tmp_path / "c")
    assert len(corpus.val_tokens) == 200
    with pytest.raises(DataError, match=rf"^data.mixture entry {folders[2]}: 801 tokens are too few for one window "
                                        rf"of model.seq_len \+ 1 = 101 in its training and validation parts$"):
        pipeline.tokenized_corpus(data((2, 0, 1)), vocab_size=vocab, seq_len=100, cache_dir=tmp_path / "c")


def test_a_prepared_dataset_is_keyed_by_its_source_and_tokenizer_and_checked_against_the_model(datasets, tmp_path):
    folders, vocab = datasets
    folder = tmp_path / "copy"
    shutil.copytree(folders[0], folder)
    data = lambda **kw: config_lib.DataConfig(source="prepared", path=str(folder), **kw)
    tok_hash = json.loads((folder / "manifest.json").read_text())["tokenizer"]
    open_ = lambda v=vocab, **kw: pipeline.tokenized_corpus(data(**kw), vocab_size=v, seq_len=SEQ_LEN,
                                                            cache_dir=tmp_path / "cache")
    assert open_().key == f"prepared:copy:{tok_hash}"   # a manifest without a source key: the folder's name
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps(manifest | {"source_key": "files:abc"}))
    assert open_().key == f"prepared:files:abc:{tok_hash}"
    with pytest.raises(DataError, match=rf"^tokenizer {folder}/tokenizer.json has {vocab} tokens but "
                                        rf"model.vocab_size is {vocab + 1}$"):
        open_(vocab + 1)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(DataError, match=rf"^tokenizer {folder}/tokenizer.json of prepared dataset {folder} "
                                        rf"does not exist$"):
        open_()
    assert open_(tokenizer=str(folders[0] / "tokenizer.json")).key == f"prepared:files:abc:{tok_hash}"


def test_each_process_reads_its_rows_of_the_validation_batches(datasets, tmp_path):
    cfg = make_cfg(datasets)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, eval_batches=3))
    whole = build(cfg, tmp_path)[2]
    halves = [build(cfg, tmp_path, process_index=p, process_count=2)[2] for p in range(2)]
    assert len(whole) == 3 and [len(h) for h in halves] == [3, 3]
    for i, batch in enumerate(whole):
        assert [len(h[i]) for h in halves] == [BATCH // 2] * 2
        np.testing.assert_array_equal(np.concatenate([h[i] for h in halves]), batch)
