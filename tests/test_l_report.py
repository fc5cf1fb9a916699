"""Experiment L's tables (scripts/sweeps/_l_report.py) on made-up reports: the stage-1 grid with the
chosen LR, the primary contrasts as pre-registered, each arm's stage 2, the uncorrected secondary
contrasts against none, linear and ramp_linear, with a failed run counted, never dropped; the pairs
whose two runs ran on different machines."""
import json

import numpy as np

from andrea_jax.repro import stats
from _summaries import summary
from test_l_choice import stage1
import _l_report  # noqa: E402  (test_l_choice puts scripts/sweeps on the path)

SEEDS = tuple(range(16))
BASE = 5.0 + 0.01 * np.sin(np.arange(16))
SHIFT = {"none": 0.0, "linear": -0.05, "linear_alpha": 0.01, "ramp_linear": -0.06, "ramp_equal": -0.058,
         "ramp_reverse": 0.02, "depth_mup": -0.1, "zero_init_out": 0.005, "gates": -0.02, "warmup250": -0.03}


def losses(arm):
    return list(BASE + SHIFT[arm] + 0.003 * np.cos((1 + len(arm)) * np.arange(16)))


def test_l_tables_from_made_up_reports(tmp_path):
    stage1_path = stage1(tmp_path, warmup250={"1e-3": 4.9}, ramp_linear={"2e-3": 4.2})
    stage2_path = summary(tmp_path / "l2.json", "l_stage2",
                          {f"{arm}_lr{'2e-3' if arm == 'ramp_linear' else '1e-3'}": ([f"x={i}"], losses(arm))
                           for i, arm in enumerate(SHIFT)}, seeds=SEEDS)
    data = json.loads(stage2_path.read_text())
    data["experiments"]["l_stage2"]["runs"]["gates_lr1e-3_s3"].update(outcome="failed", final_val_loss=None)
    stage2_path.write_text(json.dumps(data))
    runs = tmp_path / "runs" / "l_stage2" / "l_stage2"
    for arm, lr in (("none", "1e-3"), ("linear", "1e-3"), ("ramp_linear", "2e-3"), ("ramp_equal", "1e-3"),
                    ("warmup250", "1e-3")):
        for seed in SEEDS:   # two of ramp_equal's runs on the second machine
            (runs / f"{arm}_lr{lr}_s{seed}").mkdir(parents=True)
            started = _l_report.MACHINE_SWITCH + (60 if arm == "ramp_equal" and seed in (3, 7) else -60)
            (runs / f"{arm}_lr{lr}_s{seed}" / "result.json").write_text(json.dumps({"started": started}))
    text = _l_report.markdown(stage1_path, tmp_path / "no_ext.json", stage2_path, tmp_path / "runs")
    assert "- (a) linear_lr1e-3 − none_lr1e-3: 0 of 16 pairs on two machines\n" in text
    assert "- (b) ramp_linear_lr2e-3 − ramp_equal_lr1e-3: 2 of 16 pairs on two machines (seeds 3, 7)\n" in text

    grid = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    mean = lambda first: f"{np.mean([first, first + 0.01]):.3f}"   # stage1(): the second seed 0.01 above
    assert grid["| ramp_linear"] == f"| ramp_linear | {mean(5.305)} | {mean(5.105)} | **{mean(4.2)}** | {mean(5.405)} |"
    assert "| depth_mup (at 6 blocks) |" in text and "| warmup250 (the best warmup) |" in text

    primary = [line for line in text.splitlines() if line.startswith(("| a |", "| b |", "| c |"))]
    assert [line.split(" | ")[1] for line in primary] == ["linear_lr1e-3 − none_lr1e-3",
                                                          "ramp_linear_lr2e-3 − ramp_equal_lr1e-3",
                                                          "ramp_linear_lr2e-3 − warmup250_lr1e-3"]
    assert primary[0].endswith("| A better |") and primary[2].endswith("| A better |")

    assert "| gates_lr1e-3 | 15 / 16 |" in text and "| none_lr1e-3 | 16 / 16 |" in text
    secondary = [line for line in text.splitlines() if line.startswith("| ") and " − " in line
                 and line.split(" | ")[1].isdigit()]
    assert len(secondary) == 9 + 8 + 7   # each arm against none; against linear but none; against ramp_linear
    d = [a - b for a, b in zip(losses("gates"), losses("linear"))]
    d = d[:3] + d[4:]                      # seed 3 of gates failed: 15 pairs
    t = stats.paired_t(d)
    want = (f"| gates_lr1e-3 − linear_lr1e-3 | 15 | {t['mean']:+.3f} [{t['t_lo']:+.3f}, {t['t_hi']:+.3f}] | "
            f"{stats.sign_flip_p(d)['p']:.3g} |")
    assert want in secondary
    assert not any(line.startswith(("| none_lr1e-3 − linear", "| linear_lr1e-3 − ramp_linear"))
                   for line in secondary)


def test_machine_time_counts_the_time_some_run_was_training_once(tmp_path):
    # Two runs at once over [0, 10] and [5, 20], a pause, then one over [100, 130]: 50 s, not 65 or 130.
    for name, (started, ended) in {"a_s0": (0, 10), "a_s1": (5, 20), "a_s2": (100, 130)}.items():
        (tmp_path / "l2" / name).mkdir(parents=True)
        (tmp_path / "l2" / name / "result.json").write_text(json.dumps({"started": started, "ended": ended}))
    (tmp_path / "l2" / "a_s3").mkdir()   # not finished: no result.json
    assert _l_report.busy_seconds(tmp_path / "l2") == 50.0
    exp = {"runs": {"a_s0": {}, "a_s1": {}, "a_s2": {}}, "train_seconds": 7200.0}
    table = _l_report.machine_time({"stage 2": (exp, tmp_path / "l2"), "stage 1": (exp, tmp_path / "gone")})
    assert "| stage 2 | 3 | 2.0 h | 0.0 h |" in table and "| stage 1 | 3 | 2.0 h | runs not here |" in table
