"""Pairing arms across reports (andrea_jax/repro/compare.py) against hand computations."""
import itertools
import json

import numpy as np
import pytest
import scipy.stats

from andrea_jax.errors import ConfigError
from andrea_jax.repro import compare
from _summaries import summary

def test_arms_of_two_reports_pair_seed_by_seed_with_hand_computed_statistics(tmp_path):
    a = summary(tmp_path / "a.json", "h", {
        "none": (["prores.schedule=none"], [6.0, 6.2, 6.1]),
        "warm": (["prores.schedule=none", "optim.warmup_steps=312"], [5.9, 6.0, 6.05])})
    b = summary(tmp_path / "b.json", "h2",
                {"ff": (["prores.schedule=linear", "prores.forward=false"], [5.8, 6.1, 5.7])})
    rows = compare.compare_arms(compare.load_arm(f"{a}:warm"),
                                [compare.load_arm(f"{b}:ff"), compare.load_arm(f"{a}:none")])
    ff, none = rows
    d = np.array([5.8 - 5.9, 6.1 - 6.0, 5.7 - 6.05])
    half = scipy.stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
    assert ff["mean_diff"] == pytest.approx(d.mean(), abs=1e-12)
    assert ff["mean"] == pytest.approx(np.mean([5.8, 6.1, 5.7]), abs=1e-12)
    assert (ff["t_lo"], ff["t_hi"]) == (pytest.approx(d.mean() - half, abs=1e-9),
                                        pytest.approx(d.mean() + half, abs=1e-9))
    flips = [abs(np.dot(s, d)) / 3 for s in itertools.product((1, -1), repeat=3)]
    assert ff["p"] == pytest.approx(np.mean([m >= abs(d.mean()) - 1e-12 for m in flips]))
    assert (ff["n"], ff["p_min"], ff["seeds"]) == (3, 0.25, [0, 1, 2])
    # the settings that differ, the baseline's value beside each; workdir and seed never differ
    assert ff["differs"] == ["optim.warmup_steps=(unset) (baseline 312)", "prores.forward=false (baseline (unset))",
                             "prores.schedule=linear (baseline none)"]
    assert none["differs"] == ["optim.warmup_steps=(unset) (baseline 312)"]
    text = compare.table(compare.load_arm(f"{a}:warm"), rows, "final_val_loss")
    assert text.splitlines()[0] == "baseline warm: mean final_val_loss 5.983"
    assert (f"| ff | 5.867 | {d.mean():+.3f} [{d.mean() - half:+.3f}, {d.mean() + half:+.3f}] | 3 "
            f"| {ff['p']:.4g} (0.25) |") in text


def test_only_the_common_finished_seeds_pair(tmp_path):
    a = summary(tmp_path / "a.json", "h", {"none": ([], [6.0, 6.2, None, 6.3])}, seeds=(0, 1, 2, 3))
    b = summary(tmp_path / "b.json", "h", {"x": ([], [5.0, 5.1, 5.2])}, seeds=(1, 2, 3))
    (row,) = compare.compare_arms(compare.load_arm(f"{a}:none"), [compare.load_arm(f"{b}:x")])
    assert row["seeds"] == [1, 3]  # seed 2 did not finish in the baseline, seed 0 is not in the arm
    assert row["mean_diff"] == pytest.approx(((5.0 - 6.2) + (5.2 - 6.3)) / 2)


def test_bad_arms_metrics_and_unfair_pairs_are_one_line_errors(tmp_path, capsys):
    a = summary(tmp_path / "a.json", "h", {"none": ([], [6.0, 6.2, 6.1])})
    b = summary(tmp_path / "b.json", "h", {"none": ([], [5.0, 5.1, 5.2])}, seeds=(5, 6, 7))
    with pytest.raises(ConfigError, match=r"no experiment has arm 'lin'.*'h': \['none'\]"):
        compare.load_arm(f"{a}:lin")
    with pytest.raises(ConfigError, match="SUMMARY.json:ARM"):
        compare.load_arm(str(a))
    with pytest.raises(ConfigError, match="not a report's summary.json"):
        compare.load_arm(f"{tmp_path / 'missing.json'}:none")
    with pytest.raises(ConfigError, match=r"share no seed"):
        compare.compare_arms(compare.load_arm(f"{a}:none"), [compare.load_arm(f"{b}:none")])
    with pytest.raises(ConfigError, match=r"no run has 'final_loss'.*final_val_loss"):
        compare.compare_arms(compare.load_arm(f"{a}:none"), [compare.load_arm(f"{a}:none")], "final_loss")
    mixed = json.loads(a.read_text())
    mixed["experiments"]["h"]["runs"]["none_s1"]["command"] += " --set optim.lr=1e-3"
    (tmp_path / "mixed.json").write_text(json.dumps(mixed))
    with pytest.raises(ConfigError, match="differ in more than the seed"):
        compare.compare_arms(compare.load_arm(f"{a}:none"), [compare.load_arm(f"{tmp_path / 'mixed.json'}:none")])
    two = json.loads(a.read_text())
    two["experiments"]["h_again"] = two["experiments"]["h"]
    (tmp_path / "two.json").write_text(json.dumps(two))
    with pytest.raises(ConfigError, match="more than one experiment"):
        compare.load_arm(f"{tmp_path / 'two.json'}:none")
    assert compare.load_arm(f"{tmp_path / 'two.json'}:h_again/none")["name"] == "h_again/none"
    assert compare.main(["--baseline", f"{a}:none", f"{a}:nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
