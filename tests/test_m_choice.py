"""Experiment M's arms and LRs (scripts/sweeps/_m_choice.py) by the pre-registered rules, on
made-up reports of L and of M's width grids, and the three specs built from them."""
import json
import pathlib
import sys

import pytest

from andrea_jax.errors import ConfigError
from andrea_jax.repro import sweep as sweep_lib

SWEEPS = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "sweeps"
sys.path.insert(0, str(SWEEPS))
import _l_choice  # noqa: E402
import _m_choice  # noqa: E402
from l_stage1 import ARMS, LRS, STAGE1_SEEDS  # noqa: E402


def write(path: pathlib.Path, experiment: str, runs: dict) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"experiments": {experiment: {"runs": runs}}}))
    return path


def finished(loss):
    return {"outcome": "finished", "final_val_loss": loss}


@pytest.fixture
def reports(tmp_path, monkeypatch):
    """L's stage 1 (every arm best at 1e-3, linear at 2e-3) and stage 2 (ramp_equal the lowest ramp)."""
    monkeypatch.setenv("ANDREA_DOC_CORPUS", str(tmp_path / "doc_corpus"))
    lr_loss = {"5e-4": 5.3, "1e-3": 5.1, "2e-3": 5.2, "3e-3": 5.4}
    stage1 = {f"{arm}_lr{lr}_s{s}": finished(loss - (0.5 if (arm, lr) == ("linear", "2e-3") else 0))
              for arm in ARMS for lr, loss in lr_loss.items() for s in STAGE1_SEEDS}
    monkeypatch.setattr(_l_choice, "STAGE1_SUMMARY", write(tmp_path / "l1.json", "l_stage1", stage1))
    monkeypatch.setattr(_l_choice, "EXT_SUMMARY", tmp_path / "l1_ext.json")
    ramp_loss = {"ramp_linear": 5.0, "ramp_equal": 4.9, "ramp_reverse": 5.2}
    stage2 = {f"{arm}_lr1e-3_s{s}": finished(loss) for arm, loss in ramp_loss.items() for s in range(16)}
    monkeypatch.setattr(_m_choice, "L_STAGE2_SUMMARY", write(tmp_path / "l2.json", "l_stage2", stage2))
    monkeypatch.setattr(_m_choice, "WIDTH_LR_SUMMARY", tmp_path / "m" / "width_lr.json")
    return tmp_path


def load(name):
    return sweep_lib.groups(sweep_lib.load_spec(str(SWEEPS / f"{name}.py")))


def test_m_takes_ls_lrs_and_its_best_ramp_for_both_horizons(reports):
    assert _m_choice.best_ramp() == "ramp_equal"
    groups = load("mh_horizon")
    assert len(groups) == 2
    for exp in groups.values():
        assert exp.arms == {"none": (*ARMS["none"], "optim.lr=1e-3"), "linear": (*ARMS["linear"], "optim.lr=2e-3"),
                            "ramp": (*ARMS["ramp_equal"], "optim.lr=1e-3")}
        assert exp.seeds == tuple(range(200, 208)) and exp.baseline == "none"


def test_the_width_grids_extend_an_edge_and_the_width_runs_wait_for_it(reports):
    (grid,) = load("mw_width_lr").values()
    assert len(grid.arms) == 3 * 2 * len(LRS) and grid.seeds == (300, 301)
    assert grid.arms["ramp_w192_lr3e-3"][-3:] == ("model.d_model=192", "model.n_head=12", "optim.lr=3e-3")
    with pytest.raises(ConfigError, match="no report of mw_width_lr yet"):
        load("mw_width")
    loss = {"5e-4": 5.3, "1e-3": 5.1, "2e-3": 5.2, "3e-3": 5.4, "4e-3": 5.6}
    runs = {f"{arm}_lr{lr}_s{s}": finished(value - (1.0 if (arm, lr) == ("ramp_w192", "3e-3") else 0))
            for arm in ("none_w128", "none_w192", "linear_w128", "linear_w192", "ramp_w128", "ramp_w192")
            for lr, value in loss.items() if lr != "4e-3" for s in (300, 301)}
    write(_m_choice.WIDTH_LR_SUMMARY, "mw_width_lr", runs)
    best, needed, _ = _m_choice.width_lrs()
    assert needed == {"ramp_w192": ("4e-3",)} and best["none_w128"] == "1e-3"
    (grid,) = load("mw_width_lr").values()
    assert "ramp_w192_lr4e-3" in grid.arms
    with pytest.raises(ConfigError, match=r"still need \{'ramp_w192': \('4e-3',\)\}"):
        load("mw_width")
    runs |= {f"ramp_w192_lr4e-3_s{s}": finished(5.0) for s in (300, 301)}   # worse than 3e-3's 4.4
    write(_m_choice.WIDTH_LR_SUMMARY, "mw_width_lr", runs)
    (width,) = load("mw_width").values()
    assert width.arms["ramp_w192"][-1] == "optim.lr=3e-3" and width.arms["none_w128"][-1] == "optim.lr=1e-3"
    assert width.seeds == tuple(range(200, 208)) and len(width.arms) == 6


def test_a_width_grid_best_at_its_lowest_lr_is_extended_below_it(reports):
    loss = {"5e-4": 5.0, "1e-3": 5.1, "2e-3": 5.2, "3e-3": 5.4}
    runs = {f"{arm}_lr{lr}_s{s}": finished(value + (0.0 if arm == "linear_w128" else 0.3 * (lr == "5e-4")))
            for arm in ("none_w128", "none_w192", "linear_w128", "linear_w192", "ramp_w128", "ramp_w192")
            for lr, value in loss.items() for s in (300, 301)}
    write(_m_choice.WIDTH_LR_SUMMARY, "mw_width_lr", runs)
    best, needed, grid = _m_choice.width_lrs()
    assert best["linear_w128"] == "5e-4" and best["none_w128"] == "1e-3"
    assert needed == {"linear_w128": ("2.5e-4",)} and grid["linear_w128"][0] == "2.5e-4"


def test_l_s_best_ramp_reads_each_ramp_at_its_lr_and_a_diverged_seed_loses(reports, tmp_path):
    ramp_loss = {"ramp_linear": 5.0, "ramp_equal": 4.9, "ramp_reverse": 5.2}
    stage2 = {f"{arm}_lr1e-3_s{s}": finished(loss) for arm, loss in ramp_loss.items() for s in range(16)}
    # runs of ramp_reverse at an LR that is not its own are not read, however low
    stage2 |= {f"ramp_reverse_lr2e-3_s{s}": finished(3.0) for s in range(16)}
    path = write(tmp_path / "l2_other.json", "l_stage2", stage2)
    assert _m_choice.best_ramp(path) == "ramp_equal"
    # one diverged seed of ramp_equal makes its mean infinite, whatever loss the report kept for it
    stage2["ramp_equal_lr1e-3_s3"] = {"outcome": "diverged", "final_val_loss": 1.0}
    assert _m_choice.best_ramp(write(path, "l_stage2", stage2)) == "ramp_linear"
