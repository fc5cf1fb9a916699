"""Paired statistics that hold at small n (andrea_jax/repro/stats.py): the paired-t interval
against scipy's t quantile, the exact sign-flip p against a hand enumeration, and `direction`
resting on the t interval, not the bootstrap."""
import math

import pytest
from scipy import stats as scipy_stats

from andrea_jax.repro import stats, tables


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 6, 9, 10, 29, 30])
@pytest.mark.parametrize("prob", [0.975, 0.95, 0.995])
def test_t_quantile_matches_scipy(df, prob):
    # Two programs: measured 1.9e-14 relative at worst over these cases (also under AVX2).
    assert stats.t_quantile(prob, df) == pytest.approx(scipy_stats.t.ppf(prob, df), rel=1e-12)


def test_paired_t_interval_is_mean_plus_minus_t_times_standard_error():
    d = [0.1, -0.05, 0.3, 0.12]
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    half = scipy_stats.t.ppf(0.975, 3) * sd / 2
    ci = stats.paired_t(d)
    assert (ci["n"], ci["mean"]) == (4, pytest.approx(mean))
    assert (ci["t_lo"], ci["t_hi"]) == (pytest.approx(mean - half), pytest.approx(mean + half))
    lo, hi = scipy_stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
    assert (ci["t_lo"], ci["t_hi"]) == (pytest.approx(lo), pytest.approx(hi))


def test_sign_flip_p_for_three_pairs_by_hand():
    # d = (0.1, 0.2, 0.4), |sum| 0.7. The 8 flips' |sums|: 0.7 (+++, ---), 0.5, 0.3, 0.1 (twice
    # each): only the 2 all-same-sign flips reach 0.7, p = 2/8, the smallest n = 3 allows.
    assert stats.sign_flip_p([0.1, 0.2, 0.4]) == {"p": 0.25, "p_min": 0.25}
    # d = (-1, 2, 3), |sum| 4: the flips' |sums| are 4, 6, 0, 2, twice each; 4 of 8 reach 4.
    assert stats.sign_flip_p([-1.0, 2.0, 3.0])["p"] == 0.5
    # d = (0.1, 0.2, -0.4), |sum| 0.1, the smallest of all: every flip reaches it.
    assert stats.sign_flip_p([0.1, 0.2, -0.4])["p"] == 1.0


def test_sign_flip_p_counts_ties_that_differ_by_rounding():
    # d = (0.7, 0.1, 0.2, 0.3), |sum| 1.3: reached by ++++ and ---- only (next is 1.1), p = 2/16. In
    # floats the enumeration's sum (another order of the same terms) lands one rounding error below
    # the observed mean: counted without the tie, p would be 0, which no data can give.
    assert stats.sign_flip_p([0.7, 0.1, 0.2, 0.3])["p"] == 2 / 16


def test_sign_flip_p_for_five_pairs_by_hand():
    # d = (1, 2, 3, 4, 5), |sum| 15: only +++++ and -----, p = 2/32 = 1/16, the smallest n = 5 allows.
    assert stats.sign_flip_p([1.0, 2.0, 3.0, 4.0, 5.0]) == {"p": 1 / 16, "p_min": 1 / 16}
    # d = (1, 2, 3, 4, -5), |sum| 5. Flips of (1, 2, 3, 4) with sum s, and the 5 taken as +-5:
    # |s + 5| or |s - 5| >= 5. The 16 sums s of +-1 +-2 +-3 +-4 are 10, 8, 6, 4, 4, 2, 2, 0, 0, -2,
    # -2, -4, -4, -6, -8, -10. With -5: |s - 5| >= 5 when s >= 10 or s <= 0: 1 + 9 = 10 flips;
    # with +5 the mirror image, 10 more: 20 of 32.
    assert stats.sign_flip_p([1.0, 2.0, 3.0, 4.0, -5.0])["p"] == 20 / 32


def test_direction_is_unresolved_when_the_t_interval_straddles_zero_though_the_bootstrap_excludes_it():
    ci = stats.compare([0.01, 0.02, 0.2])
    assert 0 < ci["lo"] and 0 < ci["hi"]          # all three pairs positive: bootstrap [min..max] > 0
    assert ci["t_lo"] < 0 < ci["t_hi"]
    assert stats.direction(ci) == "unresolved"
    # An interval that only touches 0 does not exclude it.
    assert stats.direction(stats.compare([0.0, 0.0, 0.0])) == "unresolved"
    assert tables._holds_lower({**ci, "mean": -ci["mean"], "lo": -ci["hi"], "hi": -ci["lo"],
                                "t_lo": -ci["t_hi"], "t_hi": -ci["t_lo"]}).startswith("same sign, not resolved")


def test_tables_recompute_t_and_p_from_a_summary_that_holds_only_the_bootstrap():
    # A summary.json written before these statistics: bootstrap bounds and the per-seed differences.
    old = {"n": 3, "mean": -0.2, "lo": -0.3, "hi": -0.1, "by_seed": {"0": -0.1, "1": -0.2, "2": -0.3}}
    half = scipy_stats.t.ppf(0.975, 2) * 0.1 / math.sqrt(3)
    assert tables.fmt_ci(old) == f"-0.200 [{-0.2 - half:+.3f}, {-0.2 + half:+.3f}] (n=3, p=0.25, min p 0.25)"
