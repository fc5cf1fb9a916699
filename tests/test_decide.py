"""Deciding a family of pre-registered contrasts (andrea_jax/repro/decide.py) against hand
computations with scipy: Holm over the family, TOST at the margin, the verdicts and the command."""
import numpy as np
import pytest
import scipy.stats

from andrea_jax.errors import ConfigError
from andrea_jax.repro import compare, decide
from _summaries import summary

SEEDS = tuple(range(8))
BASE = np.array([6.40, 6.45, 6.38, 6.50, 6.42, 6.47, 6.36, 6.44])
BIG = np.array([-0.08, -0.06, -0.07, -0.09, -0.05, -0.08, -0.07, -0.06])        # clearly better
TINY = np.array([0.004, -0.003, 0.002, 0.001, -0.002, 0.003, 0.0005, -0.001])  # level at 0.02
NOISY = np.array([0.09, -0.12, 0.05, -0.03, 0.11, -0.08, 0.02, 0.07])          # neither


def _report(tmp_path):
    path = summary(tmp_path / "s.json", "l", {"none": ([], list(BASE)), "big": (["x=1"], list(BASE + BIG)),
                                                "tiny": (["x=2"], list(BASE + TINY)),
                                                "noisy": (["x=3"], list(BASE + NOISY))}, seeds=SEEDS)
    return {arm: compare.load_arm(f"{path}:{arm}") for arm in ("none", "big", "tiny", "noisy")}


def test_a_family_of_three_gets_holm_and_the_pre_registered_verdicts(tmp_path):
    arms = _report(tmp_path)
    rows = decide.decide([("a", arms["big"], arms["none"]), ("b", arms["tiny"], arms["none"]),
                          ("c", arms["noisy"], arms["none"])], 0.02)
    raw = [scipy.stats.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=np.inf).pvalue
           for d in (BIG, TINY, NOISY)]
    tost = [max(scipy.stats.ttest_1samp(d, -0.02, alternative="greater").pvalue,
                scipy.stats.ttest_1samp(d, 0.02, alternative="less").pvalue) for d in (BIG, TINY, NOISY)]

    def holm_by_hand(p):   # m = 3: the smallest x3, the next x2 (never below), the largest x1
        order = np.argsort(p)
        out, running = [0.0] * 3, 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (3 - rank) * p[i]))
            out[i] = running
        return out

    for row, d, p, p_holm, t, t_holm in zip(rows, (BIG, TINY, NOISY), raw, holm_by_hand(raw), tost, holm_by_hand(tost)):
        # the differences are computed from losses, so they agree to rounding of the additions
        assert row["mean"] == pytest.approx(d.mean(), abs=1e-12)
        assert row["p"] == pytest.approx(p, rel=1e-9) and row["p_holm"] == pytest.approx(p_holm, rel=1e-9)
        assert row["tost_p"] == pytest.approx(t, rel=1e-6) and row["tost_p_holm"] == pytest.approx(t_holm, rel=1e-6)
    assert [r["verdict"] for r in rows] == ["A better", "level", "inconclusive"]
    assert rows[0]["p_holm"] == pytest.approx(3 * 2 / 2 ** 8)     # 8 pairs of one sign, the smallest of three


def test_a_better_is_b_better_with_the_arms_swapped(tmp_path):
    arms = _report(tmp_path)
    rows = decide.decide([("a", arms["none"], arms["big"])], 0.02)
    assert rows[0]["verdict"] == "B better" and rows[0]["mean"] == pytest.approx(-BIG.mean())


def test_lost_pairs_are_counted_and_too_few_pairs_refused(tmp_path):
    path = summary(tmp_path / "s.json", "l", {"none": ([], [6.4, 6.5, 6.3]), "x": (["x=1"], [6.3, float("nan"), 6.2])})
    rows = decide.decide([("a", compare.load_arm(f"{path}:x"), compare.load_arm(f"{path}:none"))], 0.02)
    assert (rows[0]["n"], rows[0]["lost"]) == (2, 1)
    path = summary(tmp_path / "t.json", "l", {"none": ([], [6.4, 6.5]), "x": (["x=1"], [6.3, float("nan")])},
                   seeds=(0, 1))
    with pytest.raises(ConfigError, match="1 finished pair"):
        decide.decide([("a", compare.load_arm(f"{path}:x"), compare.load_arm(f"{path}:none"))], 0.02)


def test_the_command_prints_the_table_and_refuses_a_bad_margin(tmp_path, capsys):
    _report(tmp_path)
    s = tmp_path / "s.json"
    assert decide.main(["--margin", "0.02", "--contrast", "a", f"{s}:big", f"{s}:none",
                        "--contrast", "b", f"{s}:tiny", f"{s}:none"]) == 0
    out = capsys.readouterr().out
    assert "| a | big − none | 8 (0) |" in out and "| level |" in out and "TOST p at ±0.02" in out
    assert decide.main(["--margin", "0", "--contrast", "a", f"{s}:big", f"{s}:none"]) != 0
    assert "--margin must be positive" in capsys.readouterr().err
