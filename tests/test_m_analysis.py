"""Experiment M's pre-registered analysis (scripts/sweeps/_m_analysis.py) on made-up runs whose gaps
are exact lines in ln(t - 480) and ln(width): the per-seed slopes come back, the four slopes' sign-flip
p's are Holm-adjusted together, each verdict follows its sign, a lost seed (or one missing an evaluation)
is counted, only the last evaluation's gap is read, and the crossing width is 64 exp(-gap64 / slope) of
the seed means, with the 2.5th and 97.5th resampled values as its bounds."""
import json
import math
import pathlib
import sys

import numpy as np
import pytest

SWEEPS = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "sweeps"
sys.path.insert(0, str(SWEEPS))
import _m_analysis  # noqa: E402

SEEDS = tuple(range(200, 208))
H_SLOPE = {"linear": [-0.02 - 0.001 * i for i in range(8)],          # toward the paper, 8 of 8
           "ramp": [(-1) ** i * (0.01 + 0.001 * i) for i in range(8)]}  # both signs
W_SLOPE = {"linear": [-0.05 - 0.002 * i for i in range(8)],           # toward the paper
           "ramp": [0.03 + 0.001 * i for i in range(8)]}              # away from it
GAP64 = {"linear": [0.1 + 0.01 * i for i in range(8)], "ramp": [0.02] * 8}


def write_run(folder: pathlib.Path, losses: dict, outcome: str = "finished", started: float = 0.0,
              ended: float = 60.0):
    folder.mkdir(parents=True)
    result = {"outcome": outcome, "started": started, "ended": ended, "seconds": ended - started}
    (folder / "result.json").write_text(json.dumps(result))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": t, "loss": 9.0}) + "\n" +
                                                  json.dumps({"step": t, "val_loss": v}) + "\n"
                                                  for t, v in sorted(losses.items())))


def made_up_runs(root: pathlib.Path, lost_ramp_seed: int | None = None, gap64: dict = GAP64) -> pathlib.Path:
    none = lambda i, t: 6.0 + 1.0 / math.log(t) + 0.01 * i
    # before the last evaluation the width runs' gap is wider: only the final one may be read
    early = lambda t: 0.05 * (2000 - t) / 500
    for i, seed in enumerate(SEEDS):
        for steps in (2000, 8000):
            write_run(_m_analysis.horizon_run(root, "none", seed, steps),
                      {t: none(i, t) for t in range(500, steps + 1, 500)})
        for w in (128, 192):
            write_run(_m_analysis.width_run(root, "none", seed, w), {t: none(i, t) - 0.1 * w / 64
                                                                     for t in range(500, 2001, 500)})
        for arm in ("linear", "ramp"):
            # 8000 steps: the gap a line in ln(t - 480), intercept of no matter
            gaps = {t: 0.3 + H_SLOPE[arm][i] * math.log(t - 480) for t in range(500, 8001, 500)}
            write_run(_m_analysis.horizon_run(root, arm, seed, 8000), {t: none(i, t) + g for t, g in gaps.items()},
                      "failed" if arm == "ramp" and seed == lost_ramp_seed else "finished")
            # width w's final gap: GAP64 + W_SLOPE ln(w / 64); width 64 is the 2000-step horizon run
            final = {w: gap64[arm][i] + W_SLOPE[arm][i] * math.log(w / 64) for w in (64, 128, 192)}
            write_run(_m_analysis.horizon_run(root, arm, seed, 2000),
                      {t: none(i, t) + final[64] + early(t) for t in range(500, 2001, 500)})
            for w in (128, 192):
                write_run(_m_analysis.width_run(root, arm, seed, w),
                          {t: none(i, t) - 0.1 * w / 64 + final[w] + early(t) for t in range(500, 2001, 500)})
    return root


def test_the_slopes_their_holm_family_and_verdicts(tmp_path):
    runs = made_up_runs(tmp_path, lost_ramp_seed=207)
    assert list(_m_analysis.horizon_slopes(runs, "linear").values()) == pytest.approx(H_SLOPE["linear"], abs=1e-9)
    ramp_h = _m_analysis.horizon_slopes(runs, "ramp")
    assert ramp_h[207] is None and [ramp_h[s] for s in SEEDS[:7]] == pytest.approx(H_SLOPE["ramp"][:7], abs=1e-9)
    result = _m_analysis.analyse(runs)
    rows = {r["slope"]: r for r in result["rows"]}
    assert list(rows) == ["linear, ln(t - 480)", "ramp, ln(t - 480)", "linear, ln(width)", "ramp, ln(width)"]
    assert (rows["ramp, ln(t - 480)"]["n"], rows["ramp, ln(t - 480)"]["lost"]) == (7, 1)
    assert rows["linear, ln(width)"]["mean"] == pytest.approx(np.mean(W_SLOPE["linear"]), abs=1e-9)
    # 8 seeds of one sign: exact sign-flip p 2 / 2^8; Holm over the four multiplies the smallest by 4.
    for name in ("linear, ln(t - 480)", "linear, ln(width)", "ramp, ln(width)"):
        assert rows[name]["p"] == pytest.approx(2 / 2 ** 8) and rows[name]["holm_p"] == pytest.approx(4 * 2 / 2 ** 8)
    assert rows["ramp, ln(t - 480)"]["holm_p"] > 0.05
    assert [r["verdict"] for r in result["rows"]] == ["toward the paper", "no direction shown", "toward the paper",
                                                      "away from the paper"]
    assert result["ends"]["linear"][0] == pytest.approx(np.mean(GAP64["linear"]), abs=1e-9)
    assert result["ends"]["linear"][1] == pytest.approx(0.3 + np.mean(H_SLOPE["linear"]) * math.log(7520), abs=1e-9)

    # Only linear's width slope is toward the paper with a positive gap at 64.
    assert list(result["crossings"]) == ["linear"]
    crossing = result["crossings"]["linear"]
    assert crossing["w"] == pytest.approx(64 * math.exp(-np.mean(GAP64["linear"]) / np.mean(W_SLOPE["linear"])))
    assert crossing["lo"] < crossing["w"] < crossing["hi"] and crossing["never"] == 0
    text = _m_analysis.markdown(result)
    assert "| ramp, ln(t - 480) | 7 (1) |" in text and f"{crossing['w']:.0f} [" in text


def test_crossing_width_of_identical_seeds_has_no_spread_and_a_flat_slope_never_crosses():
    c = _m_analysis.crossing_width([0.1] * 8, [-0.05] * 8, n_boot=200)
    assert c["w"] == c["lo"] == c["hi"] == pytest.approx(64 * math.exp(2.0))
    flat = _m_analysis.crossing_width([0.1] * 4, [0.01, -0.01, 0.02, -0.01], n_boot=2000)
    assert flat["w"] == math.inf and 0 < flat["never"] < 1 and flat["hi"] == math.inf


def test_a_run_missing_an_evaluation_loses_its_seed(tmp_path):
    runs = made_up_runs(tmp_path)
    metrics = _m_analysis.horizon_run(runs, "linear", 203, 8000) / "metrics.jsonl"
    metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines()
                               if json.loads(line)["step"] != 4000))
    slopes = _m_analysis.horizon_slopes(runs, "linear")
    assert slopes[203] is None and sum(v is None for v in slopes.values()) == 1


def test_no_crossing_is_computed_where_the_gap_at_64_is_already_below_0(tmp_path):
    # linear's width slope is toward the paper, but its mean gap at 64 is negative: nothing to cross
    result = _m_analysis.analyse(made_up_runs(tmp_path, gap64={**GAP64, "linear": [-0.05] * 8}))
    assert next(r for r in result["rows"] if r["slope"] == "linear, ln(width)")["verdict"] == "toward the paper"
    assert result["crossings"] == {}


def test_the_crossing_interval_is_the_2_5th_and_97_5th_resampled_values():
    gap64 = [0.1, 0.12, 0.08, 0.15, 0.11, 0.13, 0.09, 0.14]
    slopes = [-0.05, -0.04, -0.07, -0.03, -0.06, -0.045, -0.055, -0.035]
    c = _m_analysis.crossing_width(gap64, slopes, n_boot=1000, seed=8)
    # the same 1000 resamples of the 8 seeds, by hand: w* of each, sorted; the 25th and 975th of them
    # (at this seed both differ from their neighbours, so another percentile rule gives other bounds)
    idx = np.random.default_rng(8).integers(0, 8, size=(1000, 8))
    w = sorted(64 * math.exp(-np.mean(np.take(gap64, i)) / np.mean(np.take(slopes, i))) for i in idx)
    assert (c["lo"], c["hi"]) == (pytest.approx(w[24], rel=1e-12), pytest.approx(w[974], rel=1e-12))


def test_each_part_s_machine_time_sums_its_runs_and_counts_overlaps_once(tmp_path):
    runs = made_up_runs(tmp_path)   # every run trained over [0, 60] s, so each part was busy 60 s
    # two LR-grid runs, one over [0, 3600] and one over [1800, 7200]: 2.5 h summed, 2.0 h busy
    for name, (start, end) in {"none_w128_lr1e-3_s300": (0, 3600), "none_w128_lr2e-3_s300": (1800, 7200)}.items():
        write_run(runs / "mw_width_lr" / "mw_width_lr" / name, {2000: 5.0}, started=start, ended=end)
    started_only = runs / "mw_width_lr" / "mw_width_lr" / "none_w192_lr1e-3_s300"   # no end: not counted
    started_only.mkdir()
    (started_only / "result.json").write_text(json.dumps({"started": 0.0}))
    time = _m_analysis.machine_time(runs)
    assert time["(i) 2000 steps"] == (24, 24 * 60.0, 60.0) and time["(i) 8000 steps"] == (24, 24 * 60.0, 60.0)
    assert time["(ii) LR grids at 128 and 192"] == (2, 9000.0, 7200.0)
    assert time["(ii) widths 128 and 192"] == (48, 48 * 60.0, 60.0)
    assert "| (ii) LR grids at 128 and 192 | 2 | 2.5 h | 2.0 h |" in _m_analysis.markdown(_m_analysis.analyse(runs))


def test_the_corpus_check_takes_width_64_from_its_own_runs_and_the_rest_unchanged(tmp_path):
    runs = made_up_runs(tmp_path)
    # width 64 trained again: each seed's gap there 0.02 higher, so each width slope falls by
    # 0.02 / slope of ln(w) against the centred ln(64), i.e. by the least-squares weight of width 64
    for i, seed in enumerate(SEEDS):
        base = _m_analysis.width_run(runs, "none", seed, 64)
        again = _m_analysis.width_run(runs, "none", seed, 64, "corpus2")
        assert again != base and again.parent.parent.name == "mw_w64_corpus2"
        for arm in ("none", *_m_analysis.ARMS):
            src = _m_analysis.width_run(runs, arm, seed, 64)
            losses = _m_analysis.val_losses(src)
            shift = 0.0 if arm == "none" else 0.02
            write_run(_m_analysis.width_run(runs, arm, seed, 64, "corpus2"), {t: v + shift for t, v in losses.items()})
    x = np.log(_m_analysis.WIDTHS)
    weight64 = (x[0] - x.mean()) / ((x - x.mean()) ** 2).sum()
    pre = {r["slope"]: r for r in _m_analysis.analyse(runs)["rows"]}
    again = {r["slope"]: r for r in _m_analysis.analyse(runs, width64="corpus2")["rows"]}
    for arm in _m_analysis.ARMS:
        assert pre[f"{arm}, ln(width)"]["mean"] == pytest.approx(np.mean(W_SLOPE[arm]), abs=1e-9)
        assert again[f"{arm}, ln(width)"]["mean"] == pytest.approx(np.mean(W_SLOPE[arm]) + 0.02 * weight64, abs=1e-9)
        horizon = f"{arm}, ln(t - 480)"
        assert again[horizon]["mean"] == pre[horizon]["mean"] and again[horizon]["p"] == pre[horizon]["p"]
