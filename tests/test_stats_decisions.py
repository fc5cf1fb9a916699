"""The statistics a pre-registered contrast is decided by (andrea_jax/repro/stats.py): Holm's
correction by hand, the equivalence test (TOST) and the Monte Carlo sign-flip p against scipy, the
smallest p that ignores exact zeros, and the stratified sign-flip by hand."""
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from andrea_jax.repro import stats


def test_holm_adjusts_by_hand_and_keeps_the_given_order():
    # sorted: 0.01 (x3 = 0.03), 0.02 (x2 = 0.04), 0.04 (x1 = 0.04, and never below the one before)
    assert stats.holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    # step-down monotonicity: 0.03 x 2 = 0.06 is raised to the 0.09 of the smaller p before it
    assert stats.holm([0.03, 0.045, 0.3]) == pytest.approx([0.09, 0.09, 0.3])
    assert stats.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])     # capped at 1
    assert stats.holm([0.02]) == [0.02]


def test_holm_of_three_contrasts_rejects_what_bonferroni_would_not():
    p = [0.012, 0.02, 0.04]
    assert [q <= 0.05 for q in stats.holm(p)] == [True, True, True]
    assert [3 * q <= 0.05 for q in p] == [True, False, False]


@pytest.mark.parametrize("diffs, margin", [
    ([0.004, -0.006, 0.01, 0.002, -0.001, 0.003, 0.0, 0.005], 0.02),      # level, inside the margin
    ([0.03, 0.01, 0.025, 0.04, 0.018], 0.02),                              # outside
    ([-0.015, -0.022, -0.018, -0.01, -0.03, -0.012], 0.02),                # on the edge, below
])
def test_tost_is_the_larger_of_two_one_sided_t_tests_as_scipy_computes_them(diffs, margin):
    lower = scipy_stats.ttest_1samp(diffs, -margin, alternative="greater").pvalue
    upper = scipy_stats.ttest_1samp(diffs, margin, alternative="less").pvalue
    result = stats.tost(diffs, margin)
    # Two programs: the closed-form t CDF against scipy's incomplete beta, 1e-12 relative measured
    assert result["p"] == pytest.approx(max(lower, upper), rel=1e-9)
    assert result["equivalent"] == (max(lower, upper) <= 0.05)


def test_tost_equivalence_is_the_90_percent_interval_inside_the_margin():
    d = [0.004, -0.006, 0.01, 0.002, -0.001, 0.003, 0.0, 0.005]
    lo, hi = scipy_stats.ttest_1samp(d, 0.0).confidence_interval(0.90)
    for margin in (0.003, 0.006, 0.009, 0.02):
        assert stats.tost(d, margin)["equivalent"] == (-margin < lo and hi < margin)


def test_tost_refuses_a_margin_that_is_not_positive():
    with pytest.raises(ValueError, match="margin"):
        stats.tost([0.1, 0.2], 0.0)


def test_monte_carlo_sign_flip_beyond_20_pairs_agrees_with_scipy_permutation_test():
    d = np.random.default_rng(3).normal(0.02, 0.05, size=24)
    mine = stats.sign_flip_p(d, n_random=200_000)
    theirs = scipy_stats.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=200_000,
                                          random_state=1).pvalue
    # Two Monte Carlo estimates of one p (about 0.06): each has sd sqrt(p (1 - p) / 2e5) = 5e-4
    assert mine["p"] == pytest.approx(theirs, abs=4e-3)
    assert mine["p_min"] == 2.0 / 2 ** 24


def test_monte_carlo_sign_flip_matches_exact_enumeration_where_both_run():
    d = np.random.default_rng(4).normal(0.01, 0.05, size=16)
    exact = stats.sign_flip_p(d)["p"]
    assert exact == pytest.approx(scipy_stats.permutation_test(
        (d,), np.mean, permutation_type="samples", n_resamples=math.inf).pvalue, rel=1e-12)
    # the Monte Carlo branch on the same 16 pairs, by lowering the exact limit
    limit = stats.EXACT_FLIPS_MAX_PAIRS
    try:
        stats.EXACT_FLIPS_MAX_PAIRS = 10
        sampled = stats.sign_flip_p(d, n_random=100_000)["p"]
    finally:
        stats.EXACT_FLIPS_MAX_PAIRS = limit
    assert sampled == pytest.approx(exact, abs=5e-3)


def test_monte_carlo_sign_flip_counts_ties_and_the_observed_assignment():
    # 22 pairs of +-1 summing to 0: every assignment reaches the observed |sum| 0, so p is exactly 1
    assert stats.sign_flip_p([1.0, -1.0] * 11, n_random=2_000)["p"] == 1.0
    # 25 equal pairs: only 2 of 2^25 assignments reach the observed sum, and 2,000 draws likely meet
    # none of them; the observed assignment still counts, so p is 1 / 2001, never 0
    assert stats.sign_flip_p([0.1] * 25, n_random=2_000)["p"] == 1 / 2_001


def test_exact_zeros_do_not_push_the_pairs_past_exact_enumeration():
    # 16 nonzero pairs and 6 exact zeros: enumerated exactly over the 16, as if the zeros were absent
    d = np.random.default_rng(5).normal(0.01, 0.05, size=16)
    alone = stats.sign_flip_p(d)["p"]
    assert stats.sign_flip_p([*d, *[0.0] * 6], n_random=2_000)["p"] == alone


def test_tost_of_constant_differences_decides_by_the_mean_alone():
    # no spread, so no t: inside the margin is equivalent, outside is not
    assert stats.tost([0.01] * 5, 0.02) == {"n": 5, "margin": 0.02, "p": 0.0, "equivalent": True}
    assert stats.tost([0.05] * 5, 0.02) == {"n": 5, "margin": 0.02, "p": 1.0, "equivalent": False}


def test_the_smallest_p_counts_only_nonzero_pairs():
    # 4 pairs, one exactly 0: its flip changes nothing, so only 2 of 2^3 flips reach the observed
    result = stats.sign_flip_p([0.1, 0.2, 0.4, 0.0])
    assert result == {"p": 0.25, "p_min": 0.25}
    assert stats.sign_flip_p([0.0, 0.0])["p"] == 1.0


def test_stratified_sign_flip_weighs_recipes_equally_and_flips_within_them():
    # recipe a: 3 pairs, b: 1 pair. Statistic = (mean_a + mean_b) / 2, weights 1/6 on a, 1/2 on b.
    strata = {"a": [0.3, 0.3, 0.3], "b": [-0.3]}
    result = stats.stratified_sign_flip(strata)
    assert result["mean"] == pytest.approx(0.0)
    assert result["strata"] == {"a": {"n": 3, "mean": pytest.approx(0.3)}, "b": {"n": 1, "mean": -0.3}}
    assert result["p"] == 1.0          # the observed |statistic| is 0: every flip reaches it
    # b's single pair weighs as much as a's three: flips of b alone (+-0.15) against a's (+-0.05k)
    result = stats.stratified_sign_flip({"a": [0.3, 0.3, 0.3], "b": [0.3]})
    # weighted |sums| over 16 flips: 0.3 only when all four signs agree (2 of 16)
    assert (result["mean"], result["p"], result["p_min"]) == (pytest.approx(0.3), 0.125, 0.125)
    assert result["exact"]
    # 21 nonzero pairs in all are past exact enumeration, whatever the strata.
    assert not stats.stratified_sign_flip({"a": [0.1] * 11, "b": [0.2] * 10})["exact"]
    # unstratified pooling of the same pairs would weigh a 3:1 and give another statistic
    assert stats.stratified_sign_flip({"a": [0.3, 0.3, 0.3], "b": [-0.3]})["mean"] != pytest.approx(
        np.mean([0.3, 0.3, 0.3, -0.3]))


def test_stratified_sign_flip_refuses_an_empty_stratum():
    with pytest.raises(ValueError, match="every stratum"):
        stats.stratified_sign_flip({"a": [0.1], "b": []})
