"""Experiment M's exploratory horizon control (scripts/sweeps/_m_control.py) on made-up runs: against
a baseline whose own gap to `none` is an exact line in ln(t - 480), each arm's slope is the
pre-registered one minus that line's slope, seed by seed; a lost control run loses its seed there only;
the spread at 2000 is the baseline's across seeds."""
import math
import sys

import numpy as np
import pytest

from test_m_analysis import H_SLOPE, SEEDS, SWEEPS, made_up_runs, write_run

sys.path.insert(0, str(SWEEPS))
import _m_analysis  # noqa: E402
import _m_control  # noqa: E402

D = {"none_lr1e-3": [0.01 * i for i in range(8)], "warmup1000": [-0.03] * 8}


def with_controls(root, lost=None):
    runs = made_up_runs(root)
    for control, d in D.items():
        for i, seed in enumerate(SEEDS):
            none = _m_analysis.val_losses(_m_analysis.horizon_run(runs, "none", seed, 8000))
            write_run(_m_control.control_run(runs, control, seed),
                      {t: v + d[i] * math.log(t - 480) for t, v in none.items()},
                      "failed" if (control, seed) == lost else "finished")
    return runs


def test_each_slope_is_the_preregistered_one_minus_the_baseline_s_own(tmp_path):
    result = _m_control.analyse(with_controls(tmp_path, lost=("warmup1000", 204)))
    rows = {(r["arm"], r["baseline"]): r for r in result["rows"]}
    assert len(rows) == 6
    for arm in ("linear", "ramp"):
        assert rows[(arm, "none (L LR)")]["mean"] == pytest.approx(np.mean(H_SLOPE[arm]), abs=1e-9)
        assert rows[(arm, "none_lr1e-3")]["mean"] == pytest.approx(np.mean(H_SLOPE[arm]) - np.mean(D["none_lr1e-3"]),
                                                                  abs=1e-9)
        kept = [H_SLOPE[arm][i] + 0.03 for i, s in enumerate(SEEDS) if s != 204]
        assert (rows[(arm, "warmup1000")]["n"], rows[(arm, "warmup1000")]["lost"]) == (7, 1)
        assert rows[(arm, "warmup1000")]["mean"] == pytest.approx(np.mean(kept), abs=1e-9)
    # linear's slopes against warmup1000 are all positive (0.01 - 0.001 i): exact p 2 / 2^7
    assert rows[("linear", "warmup1000")]["p"] == pytest.approx(2 / 2 ** 7)
    mean, sd, n = result["spread"]["none_lr1e-3"]
    at_2000 = [6.0 + 1 / math.log(2000) + 0.01 * i + D["none_lr1e-3"][i] * math.log(1520) for i in range(8)]
    assert (mean, sd, n) == (pytest.approx(np.mean(at_2000)), pytest.approx(np.std(at_2000, ddof=1)), 8)
    assert "| ramp − warmup1000 | 7 (1) |" in _m_control.markdown(result)
