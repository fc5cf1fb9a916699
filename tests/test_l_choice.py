"""Experiment L's stage-1 choices (scripts/sweeps/_l_choice.py) by the pre-registered rules, on
made-up reports: the best LR of each arm, the grid extensions an edge asks for, the best warmup,
and stage 2's spec built from them."""
import json
import pathlib
import sys

import pytest

from andrea_jax.errors import ConfigError
from andrea_jax.repro import sweep as sweep_lib

SWEEPS = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "sweeps"
sys.path.insert(0, str(SWEEPS))
import _l_choice  # noqa: E402
from l_stage1 import ARMS, LRS, STAGE1_SEEDS  # noqa: E402

LOSS_AT = {"5e-4": 5.3, "1e-3": 5.1, "2e-3": 5.2, "3e-3": 5.4, "2.5e-4": 5.6, "4e-3": 5.5, "6e-3": 5.7}


def report(path: pathlib.Path, experiment: str, losses: dict) -> pathlib.Path:
    """A kept report whose run ARM_lrLR_sSEED ended at losses[(arm, lr)] (+0.01 on the second seed)."""
    runs = {f"{arm}_lr{lr}_s{seed}": {"outcome": "finished", "final_val_loss": loss + 0.01 * i}
            for (arm, lr), loss in losses.items() for i, seed in enumerate(STAGE1_SEEDS)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"experiments": {experiment: {"runs": runs}}}))
    return path


def stage1(tmp_path, **shifts):
    """Every arm at LOSS_AT, an arm's losses changed by shifts[arm] = {lr: loss}."""
    losses = {(arm, lr): shifts.get(arm, {}).get(lr, LOSS_AT[lr] + 0.001 * i)
              for i, arm in enumerate(ARMS) for lr in LRS}
    return report(tmp_path / "stage1.json", "l_stage1", losses)


def test_interior_bests_need_nothing_and_the_best_warmup_is_the_lowest_of_the_three(tmp_path):
    path = stage1(tmp_path, warmup250={"1e-3": 4.9})
    best, warmup, needed = _l_choice.choose(path, tmp_path / "none.json")
    assert best == {arm: "1e-3" for arm in ARMS} and warmup == "warmup250" and needed == {}


def test_an_edge_asks_for_the_next_rung_and_is_settled_once_it_ran(tmp_path):
    path = stage1(tmp_path, linear={"5e-4": 4.0}, gates={"3e-3": 4.0},
                  none={"2e-3": float("nan")})   # a non-finite loss in a finished run is no best
    best, _, needed = _l_choice.choose(path, tmp_path / "ext.json")
    assert needed == {"linear": ("2.5e-4",), "gates": ("4e-3",)} and best["linear"] == "5e-4"
    ext = report(tmp_path / "ext.json", "l_stage1_ext", {("linear", "2.5e-4"): 4.5, ("gates", "4e-3"): 3.9})
    best, _, needed = _l_choice.choose(path, ext)
    assert (best["linear"], best["gates"]) == ("5e-4", "4e-3") and needed == {"gates": ("6e-3",)}


def test_a_best_warmup_of_500_steps_adds_1000_at_warmup500s_lrs(tmp_path):
    path = stage1(tmp_path, warmup500={"1e-3": 4.0})
    _, warmup, needed = _l_choice.choose(path, tmp_path / "ext.json")
    assert warmup == "warmup500" and needed == {"warmup1000": LRS}


def test_a_diverged_run_is_an_infinite_loss(tmp_path):
    path = stage1(tmp_path)
    data = json.loads(path.read_text())
    data["experiments"]["l_stage1"]["runs"]["none_lr1e-3_s100"] = {"outcome": "diverged", "final_val_loss": 1.0}
    path.write_text(json.dumps(data))
    best, _, _ = _l_choice.choose(path, tmp_path / "ext.json")
    assert best["none"] == "2e-3"


def test_stage_2_runs_each_arm_at_its_chosen_lr_on_16_fresh_seeds_or_refuses_before_extensions(
        tmp_path, monkeypatch):
    monkeypatch.setenv("ANDREA_DOC_CORPUS", str(tmp_path / "doc_corpus"))
    monkeypatch.setattr(_l_choice, "STAGE1_SUMMARY", stage1(tmp_path, ramp_linear={"2e-3": 4.0},
                                                            warmup250={"1e-3": 4.9}))
    monkeypatch.setattr(_l_choice, "EXT_SUMMARY", tmp_path / "ext.json")
    (exp,) = sweep_lib.groups(sweep_lib.load_spec(str(SWEEPS / "l_stage2.py"))).values()
    assert set(exp.arms) == {"none_lr1e-3", "linear_lr1e-3", "linear_alpha_lr1e-3", "ramp_linear_lr2e-3",
                             "ramp_equal_lr1e-3", "ramp_reverse_lr1e-3", "depth_mup_lr1e-3", "zero_init_out_lr1e-3",
                             "gates_lr1e-3", "warmup250_lr1e-3"}
    assert exp.seeds == tuple(range(16)) and not set(exp.seeds) & set(STAGE1_SEEDS)
    assert "model.n_layer=6" not in exp.arms["depth_mup_lr1e-3"]   # tuned at 6 blocks, run at 24
    assert exp.arms["ramp_linear_lr2e-3"] == (*ARMS["ramp_linear"], "optim.lr=2e-3")
    monkeypatch.setattr(_l_choice, "STAGE1_SUMMARY", stage1(tmp_path, gates={"3e-3": 4.0}))
    with pytest.raises(ConfigError, match=r"still need extensions \{'gates': \('4e-3',\)\}"):
        sweep_lib.load_spec(str(SWEEPS / "l_stage2.py"))
    (ext,) = sweep_lib.groups(sweep_lib.load_spec(str(SWEEPS / "l_stage1_ext.py"))).values()
    assert list(ext.arms) == ["gates_lr4e-3"] and ext.seeds == STAGE1_SEEDS
