"""Experiment L's conditional follow-up at 48 blocks (scripts/sweeps/_l48_choice.py, l48_warmup.py,
l48.py) on made-up reports: due only when L's contrast (b), Holm over three, finds shallow-first
better; its warmup W chosen from 490 and the stage-1 W; its stage built from the choices."""
import runpy

import numpy as np
import pytest

from andrea_jax.errors import ConfigError
from andrea_jax.repro import sweep as sweep_lib
from _summaries import summary
from test_l_choice import SWEEPS, report, stage1
import _l48_choice  # noqa: E402  (test_l_choice puts scripts/sweeps on the path)
import _l_choice  # noqa: E402
from l_stage1 import ARMS, STAGE1_SEEDS  # noqa: E402

BASE = 5.0 + 0.01 * np.sin(np.arange(16))          # a made-up stage-2 loss per seed
NOISE = np.cos(3 * np.arange(16))                  # mean 0.05, sd 0.66


def stage2(path, b_shift: float, noise: float = 0.004):
    """L's stage 2 at the LRs of stage1(warmup250 best): ramp_linear - ramp_equal = b_shift + noise NOISE."""
    arms = {f"{arm}_lr1e-3": ([f"x={i}"], list(BASE + 0.001 * i)) for i, arm in
            enumerate(("none", "linear", "ramp_equal", "warmup250"))}
    arms["ramp_linear_lr1e-3"] = (["x=9"], list(BASE + 0.002 + b_shift + noise * NOISE))
    return summary(path, "l_stage2", arms, seeds=tuple(range(16)))


@pytest.fixture
def reports(tmp_path, monkeypatch):
    monkeypatch.setenv("ANDREA_DOC_CORPUS", str(tmp_path / "doc_corpus"))
    monkeypatch.setattr(_l_choice, "STAGE1_SUMMARY", stage1(tmp_path, warmup250={"1e-3": 4.9}))
    monkeypatch.setattr(_l_choice, "EXT_SUMMARY", tmp_path / "ext.json")
    monkeypatch.setattr(_l48_choice, "WARMUP_SUMMARY", tmp_path / "l48_warmup.json")
    return tmp_path


def load(name):
    (exp,) = sweep_lib.groups(sweep_lib.load_spec(str(SWEEPS / f"{name}.py"))).values()
    return exp


@pytest.mark.parametrize("b_shift, noise, verdict", [(0.0, 0.004, "level"), (-0.01, 0.05, "inconclusive"),
                                                     (0.06, 0.004, "B better")])
def test_the_follow_up_is_not_due_unless_shallow_first_won_b(reports, monkeypatch, b_shift, noise, verdict):
    monkeypatch.setattr(_l48_choice, "L_STAGE2_SUMMARY", stage2(reports / "l2.json", b_shift, noise))
    assert _l48_choice.stage2_verdicts()["b"] == verdict
    for name in ("l48_warmup", "l48"):
        with pytest.raises(ConfigError, match=f"not due: .* is '{verdict}'"):
            load(name)


def test_when_due_it_chooses_the_warmup_then_runs_three_arms_at_48_blocks(reports, monkeypatch):
    monkeypatch.setattr(_l48_choice, "L_STAGE2_SUMMARY", stage2(reports / "l2.json", -0.05))
    assert _l48_choice.stage2_verdicts()["b"] == "A better"
    warmup = load("l48_warmup")   # W at its stage-1 value (250) and at ProRes's mean ramp at 48 blocks
    assert list(warmup.arms) == ["warmup250_lr1e-3", "warmup490_lr1e-3"] and warmup.seeds == STAGE1_SEEDS
    assert warmup.arms["warmup490_lr1e-3"] == ("prores.schedule=none", "optim.warmup_steps=490", "optim.lr=1e-3")
    assert "model.n_layer=48" in warmup.common and "model.n_layer=24" not in warmup.common
    with pytest.raises(ConfigError, match="no report of l48_warmup"):
        load("l48")
    report(reports / "l48_warmup.json", "l48_warmup", {("warmup250", "1e-3"): 4.6})
    with pytest.raises(ConfigError, match="warmup490_lr1e-3_s100 is not run"):
        load("l48")
    report(reports / "l48_warmup.json", "l48_warmup", {("warmup250", "1e-3"): 4.6, ("warmup490", "1e-3"): 4.5})
    exp = load("l48")
    assert list(exp.arms) == ["ramp_linear_lr1e-3", "ramp_equal_lr1e-3", "warmup490_lr1e-3"]
    assert exp.arms["ramp_equal_lr1e-3"] == (*ARMS["ramp_equal"], "optim.lr=1e-3") and exp.seeds == tuple(range(16))
    assert exp.baseline == "ramp_equal_lr1e-3" and "model.n_layer=48" in exp.common
    command = runpy.run_path(str(SWEEPS / "l48.py"))["decide_command"]("S.json")
    assert command == ("python -m andrea_jax.repro.decide --margin 0.02 --contrast b S.json:ramp_linear_lr1e-3 "
                       "S.json:ramp_equal_lr1e-3 --contrast c S.json:ramp_linear_lr1e-3 S.json:warmup490_lr1e-3")
    report(reports / "l48_warmup.json", "l48_warmup", {("warmup250", "1e-3"): 4.5, ("warmup490", "1e-3"): 4.5})
    assert _l48_choice.best_warmup() == "warmup250_lr1e-3"   # a tie goes to the shorter W
