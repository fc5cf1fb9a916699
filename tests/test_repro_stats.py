"""The reproduction's statistics (andrea_jax/repro/stats.py, summarize.grad_ratio) on data whose
answer is known by hand."""
import json
import math
import statistics

import numpy as np
import pytest

from andrea_jax.repro import stats, summarize, tables


def test_bootstrap_of_two_pairs_is_their_range():
    # Resampling 2 values: mean a (p 1/4), (a+b)/2 (1/2), b (1/4), so the 2.5% and 97.5% quantiles are a and b.
    ci = stats.bootstrap_ci([0.1, 0.3])
    assert ci["n"] == 2 and ci["mean"] == pytest.approx(0.2)
    assert (ci["lo"], ci["hi"]) == (pytest.approx(0.1), pytest.approx(0.3))


def test_describe_drops_unfinished_runs_and_reports_the_sample_std():
    d = stats.describe([4.0, math.nan, None, 5.0, 7.0])
    assert d == {"n": 3, "mean": pytest.approx(statistics.mean([4.0, 5.0, 7.0])),
                 "std": pytest.approx(statistics.stdev([4.0, 5.0, 7.0])), "min": 4.0, "max": 7.0}
    assert stats.describe([3.0])["std"] == 0.0 and stats.describe([math.nan])["n"] == 0


@pytest.mark.parametrize("level", [0.5, 0.9])
def test_bootstrap_interval_is_the_central_level_of_the_resampled_means(level):
    # Resampled means of 10 spread values are nearly normal with sd = population sd / sqrt(n).
    d = np.arange(10.0)
    ci = stats.bootstrap_ci(d, level=level)
    z = statistics.NormalDist().inv_cdf((1 + level) / 2)
    expected = 2 * z * d.std() / math.sqrt(len(d))
    assert (ci["hi"] - ci["lo"]) / expected == pytest.approx(1.0, abs=0.05)
    assert (ci["lo"] + ci["hi"]) / 2 == pytest.approx(d.mean(), abs=0.05)


def test_bootstrap_of_a_constant_shift_contains_it_and_excludes_zero():
    rng = np.random.default_rng(1)
    base = {s: 5.0 + rng.normal(0, 0.5) for s in range(8)}          # seeds differ by far more than the shift
    arm = {s: v - 0.1 + rng.normal(0, 0.01) for s, v in base.items()}
    diffs = stats.paired_differences(arm, base)
    ci = stats.compare(diffs.values())
    assert ci["lo"] < -0.1 < ci["hi"] < 0 and ci["t_lo"] < -0.1 < ci["t_hi"] < 0
    assert stats.direction(ci) == "lower"
    # Unpaired, the seed spread (0.5) would swamp the shift: the pairing is what resolves it.
    assert np.std(list(base.values())) > 0.3


def test_paired_differences_skip_seeds_missing_in_either_arm():
    diffs = stats.paired_differences({0: 1.0, 1: math.nan, 2: 3.0}, {0: 0.5, 1: 1.0, 3: 2.0})
    assert diffs == {0: 0.5}
    assert stats.compare([])["n"] == 0 and stats.direction(stats.compare([])) == "no pairs"
    assert stats.direction(stats.compare([-0.1, 0.1])) == "unresolved"
    assert stats.direction(stats.compare([-0.1])) == "unresolved"  # one pair: no interval


def test_escape_counts_runs_below_the_plateau_minus_the_margin():
    e = stats.escape([4.0, 5.6, 5.4, math.nan], plateau=6.0, margin=0.5)
    # 5.6 is above 5.5; NaN (diverged) has not escaped.
    assert (e["escaped"], e["runs"], e["threshold"]) == (2, 4, 5.5)
    assert e["rate"] == 0.5
    # "below" is strict: a loss exactly at the threshold has not escaped.
    assert stats.escape([5.5, 5.25], plateau=6.0, margin=0.5)["escaped"] == 1


def test_unigram_cross_entropy_of_a_uniform_corpus():
    train = np.repeat(np.arange(4), 25)       # 4 tokens, 25 each: entropy log 4
    val = np.array([0, 1, 2, 3])
    u = stats.unigram_cross_entropy(train, val, vocab_size=8)
    assert u["train_entropy"] == pytest.approx(math.log(4))
    # Add-one smoothing over 8 ids: q = (25 + 1) / (100 + 8) for each seen token.
    assert u["val_cross_entropy"] == pytest.approx(-math.log(26 / 108))


def test_unigram_entropy_of_a_skewed_corpus_by_hand():
    u = stats.unigram_cross_entropy([0, 0, 1], [2, 0], vocab_size=3)
    assert u["train_entropy"] == pytest.approx(-(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)))
    # Add-one over 3 ids: q = (2+1, 1+1, 0+1) / (3 + 3).
    assert u["val_cross_entropy"] == pytest.approx(-(math.log(1 / 6) + math.log(3 / 6)) / 2)


def test_grad_ratio_is_nan_where_the_last_block_gets_no_gradient():
    ratio = summarize.grad_ratio([[2.0, 1.0, 4.0], [1.0, 1.0, 0.0]])
    assert ratio[0] == pytest.approx(0.5) and math.isnan(ratio[1])


def _arm(finals, outcomes=None, escaped=None):
    n = len(finals)
    return {"final_val_loss": stats.describe(finals),
            "outcomes": {"finished": n, "diverged": 0, "failed": 0, "not run": 0, **(outcomes or {})},
            "escape": {"escaped": n if escaped is None else escaped, "runs": n}}


def test_comparison_table_reads_the_paper_ordering():
    arms = {"none": _arm([5.0, 5.1, 5.2]), "linear": _arm([4.8, 4.9, 5.0]),
            "equal": _arm([math.nan] * 3, {"finished": 0, "diverged": 3}, 0),
            "reverse": _arm([5.9, 5.9, 5.9], escaped=0)}
    arms["linear"]["paired_final_val_loss"] = stats.compare([-0.2, -0.21, -0.19])
    rows = tables.comparison_rows({"ablation": {"arms": arms}})
    verdicts = {r[1]: r[4] for r in rows}
    assert verdicts["linear beats the baseline"].startswith("**yes**")
    assert verdicts["equal fails"] == "**yes**" and verdicts["reverse fails"] == "**yes**"
    assert verdicts["ordering"] == "**yes**"
    assert tables.ordering(arms) == "linear < none < reverse < equal"

    # When linear fails as well, the paper's contrast is missing.
    arms["linear"] = _arm([6.0] * 3, escaped=0)
    verdicts = {r[1]: r[4] for r in tables.comparison_rows({"ablation": {"arms": arms}})}
    assert verdicts["equal fails"].startswith("partly")
    assert verdicts["linear beats the baseline"] == "not measured"  # no paired difference given


def test_growth_shape_tells_linear_from_exponential():
    layers = np.arange(1, 25)
    linear = summarize.growth_shape(1.0 + 0.5 * layers)
    exponential = summarize.growth_shape(1.2 ** layers)
    assert linear["linear_r2"] == pytest.approx(1.0) and linear["linear_r2"] > linear["exponential_r2"]
    assert exponential["exponential_r2"] == pytest.approx(1.0)
    assert exponential["exponential_r2"] > exponential["linear_r2"]


def test_the_unigram_plateau_of_a_run_on_a_prepared_dataset_is_that_of_its_own_tokens(tmp_path):
    from andrea_jax.data import shard_writer, token_cache, token_shards, tokenizer as tokenizer_lib
    from andrea_jax.repro import report
    tok = tokenizer_lib.train(["to be or not to be, that is the question"] * 20, vocab_size=270)
    folder = tmp_path / "prepared"
    folder.mkdir()
    # training tokens uniform over 0..49, the held-out tail only 0..9: a plateau of its own
    ids = np.concatenate([np.random.default_rng(0).integers(0, 50, 1800), np.arange(200) % 10]).astype(np.uint16)
    marker = shard_writer.write_shard(folder, token_shards.shard_file(0, 1), [(ids, np.array([2000]))], np.uint16,
                                      {"tokenizer": token_cache.tokenizer_hash(tok)})
    shard_writer.write_manifest(folder, [marker], tokenizer=token_cache.tokenizer_hash(tok))
    tok.save(str(folder / "tokenizer.json"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"data": {"source": "prepared", "path": str(folder),
                                                          "val_fraction": 0.1}}))
    assert report.unigram_plateau(run) == stats.unigram_cross_entropy(ids[:1800], ids[1800:], 270)


def test_the_machine_line_names_the_cpu_its_widest_vector_isa_and_jax(tmp_path):
    # a run repeats bit for bit only on a like machine, so a report must say which it ran on
    import importlib.metadata
    import os
    from andrea_jax.repro import report
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n")
    jax = importlib.metadata.version("jax")
    assert report.machine(cpuinfo) == f"{os.cpu_count()} CPU cores (AMD EPYC, AVX2), Linux, jax {jax}"
    cpuinfo.write_text("model name\t: Intel Xeon\nflags\t\t: avx avx2 avx512f avx512bw\n")
    assert report.machine(cpuinfo).startswith(f"{os.cpu_count()} CPU cores (Intel Xeon, AVX-512), ")
