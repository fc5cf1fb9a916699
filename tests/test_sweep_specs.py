"""The research sweeps in scripts/sweeps/: every spec loads and every run's config validates, each
experiment has the recipe and seed count its docstring states, and one runs at a toy size."""
import dataclasses
import json
import math
import pathlib
import re
import subprocess
import sys

import pytest

from andrea_jax import config as config_lib, configs
from andrea_jax.errors import ConfigError
from andrea_jax.repro import sweep as sweep_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
SPECS = sorted(p for p in (ROOT / "scripts" / "sweeps").glob("*.py") if not p.name.startswith("_"))
# name -> (the fewest seeds, the arms or groups it must hold)
QUESTIONS = {"h_prores_or_warmup": 5, "h_depth_params": 5, "h_lr_control": 5,
             "i_postln_lr": 4, "i_postln_lr_low": 2, "i_postln_best": 4, "j_sandwich": 4, "j_weight_decay": 3,
             "k_postln_dose": 3, "k_postln_dose_scripts": 3, "k_function_preserving": 5, "g_depth_again": 5,
             "m_muon_tiny": 5, "m_muon_postln": 5, "l_stage1": 2, "l_width512": 1}


@pytest.fixture(autouse=True)
def corpus_anywhere(monkeypatch, tmp_path):
    monkeypatch.setenv("ANDREA_DOC_CORPUS", str(tmp_path / "doc_corpus"))  # not needed to validate


def resolved(spec_name: str, arm: str, group: str | None = None) -> config_lib.Config:
    exps = sweep_lib.groups(sweep_lib.load_spec(str(ROOT / "scripts" / "sweeps" / f"{spec_name}.py")))
    exp = exps[group or spec_name]
    return config_lib.override(configs.load(exp.config), [*exp.common, *exp.arms[arm]])


# Specs whose LRs are computed from a kept report: until the report says what they need, loading
# them refuses with the reason (tests/test_l_choice.py and test_m_choice.py load them on made-up reports).
AWAITING = {"l_stage1_ext": "no report of l_stage1|need no extension",
            "l_stage2": "no report of l_stage1|still need extensions",
            "l48_warmup": "no report of l_stage(1|2)|not due",
            "l48": "no report of l(_stage1|_stage2|48_warmup)|not due",
            "mh_horizon": "no report of l_stage", "mw_width_lr": "no report of l_stage",
            "mw_width": "no report of (l_stage|mw_width_lr)|still need"}


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_every_spec_loads_and_validates(spec):
    try:
        exps = sweep_lib.groups(sweep_lib.load_spec(str(spec)))
    except ConfigError as e:
        assert spec.stem in AWAITING and re.search(AWAITING[spec.stem], str(e)), (spec.stem, str(e))
        return
    assert exps
    if spec.stem in QUESTIONS:
        assert all(len(e.seeds) >= QUESTIONS[spec.stem] for e in exps.values()), spec.stem


def test_experiment_h_is_the_recipe_the_question_sets():
    cfg = resolved("h_prores_or_warmup", "linear_alpha_T50")
    assert (cfg.model.d_model, cfg.model.n_layer, cfg.model.norm) == (64, 24, "pre")
    assert (cfg.train.steps, cfg.train.batch_size, cfg.model.seq_len, cfg.train.eval_batches) == (1500, 8, 32, 64)
    assert ((cfg.optim.lr, cfg.optim.warmup_steps, cfg.prores.warmup, cfg.prores.scale_updates)
            == (3e-3, 60, 50, "alpha"))
    assert cfg.data.source == "prepared" and cfg.model.vocab_size == 8449
    # the stretched warmup lasts as long as ProRes's ramps do on average: T (L + 1) / 2
    assert resolved("h_prores_or_warmup", "none_warmup312").optim.warmup_steps == 25 * 25 // 2


def test_the_post_ln_protocols_give_the_ramp_to_warmup_ratios_of_the_paper_and_its_scripts():
    for spec, lo, hi in [("k_postln_dose", 1.2, 2.4), ("k_postln_dose_scripts", 12, 12)]:
        cfg = resolved(spec, "linear_square")
        assert cfg.model.norm == "post"
        assert lo <= cfg.prores.warmup * cfg.model.n_layer / cfg.optim.warmup_steps <= hi, spec
    assert resolved("k_postln_dose", "none").optim.warmup_steps == 0.1 * 1500  # the paper's 10% LR warmup


def test_k_function_preserving_at_5_seeds_is_ks_recipe_for_its_two_arms():
    for arm in ("none", "function_preserving"):
        assert resolved("k_function_preserving", arm) == resolved("k_postln_dose", arm)
    assert resolved("k_function_preserving", "function_preserving").model.zero_init_out


def test_g_again_keeps_its_schedules_above_adams_horizon_and_ends_the_ramp_by_half_the_run():
    for depth in (12, 24, 48):
        cfg = resolved("g_depth_again", "linear", f"g_depth_again/n_layer={depth}")
        assert cfg.model.n_layer == depth and cfg.prores.warmup >= 20 and cfg.optim.warmup_steps >= 60
        assert cfg.prores.warmup * depth <= cfg.train.steps / 2


def test_experiment_h_runs_at_a_toy_size(tmp_path, tok_path):
    runs = tmp_path / "runs"
    # The toy shrunk further, to one block of width 32 (2 heads): the spec's arms and recipe still run, and a
    # smaller step compiles faster. One run at a time: the second finds the programs the arms share (the
    # state's initialisation, the evaluation) compiled by the first, where two at once would both compile them.
    proc = subprocess.run([sys.executable, "-m", "andrea_jax.repro.sweep", "scripts/sweeps/h_prores_or_warmup.py",
                           "--runs", str(runs), "--jobs", "1", "--toy",
                           "--set", "data.source=embedded", "--set", "data.path=", "--set", "model.vocab_size=300",
                           "--set", f"data.tokenizer={tok_path}", "--set", "model.n_layer=1",
                           "--set", "model.d_model=32", "--set", "model.n_head=2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert sorted(p.parent.name for p in runs.rglob("result.json")) == ["none_s0", "none_warmup312_s0"]


def test_the_muon_comparisons_pair_the_two_optimizers_on_one_recipe_and_fresh_seeds():
    def load(name):
        return list(sweep_lib.groups(sweep_lib.load_spec(str(ROOT / "scripts" / "sweeps" / f"{name}.py"))).values())

    for recipe, norm in [("tiny", "pre"), ("postln", "post")]:
        (exp,), (grid,) = load(f"m_muon_{recipe}"), load(f"m_muon_grid_{recipe}")
        adamw, muon = (resolved(f"m_muon_{recipe}", arm) for arm in exp.arms)
        assert (adamw.optim.name, muon.optim.name) == ("adamw", "muon") and exp.baseline == list(exp.arms)[0]
        assert dataclasses.replace(muon, optim=adamw.optim) == adamw, "the arms differ in more than the optimizer"
        assert muon.model.norm == norm and not set(exp.seeds) & set(grid.seeds), "stage 2 reuses the grid's seed"


def test_j_sandwich_differs_from_experiment_h_only_in_the_norm_placement():
    # its Pre-LN side is H's own runs, so the two must be one recipe but for model.norm
    for arm in ("none", "linear"):
        sandwich, pre = resolved("j_sandwich", arm), resolved("h_prores_or_warmup", arm)
        assert sandwich.model.norm == "sandwich" and pre.model.norm == "pre"
        assert dataclasses.replace(sandwich, model=dataclasses.replace(sandwich.model, norm="pre")) == pre
    assert set(sweep_lib.load_spec(str(ROOT / "scripts" / "sweeps" / "j_sandwich.py")).seeds) <= \
        set(sweep_lib.load_spec(str(ROOT / "scripts" / "sweeps" / "h_prores_or_warmup.py")).seeds)


def test_stage_2_of_i_takes_each_arms_lr_of_lowest_mean_loss_on_the_chosen_seeds(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts" / "sweeps"))
    try:
        from _questions import best_lrs
    finally:
        sys.path.remove(str(ROOT / "scripts" / "sweeps"))
    finished = lambda loss: {"outcome": "finished", "final_val_loss": loss}
    runs = {"a_lr1_s0": finished(5.0), "a_lr1_s1": finished(7.0),      # mean 6.0
            "a_lr2_s0": finished(6.5), "a_lr2_s1": finished(5.9),      # mean 6.2, but the best of seed 0
            "a_lr2_s2": finished(1.0),                                 # not a chosen seed
            "b_lr1_s0": finished(6.0), "b_lr1_s1": finished(6.0),
            "b_lr2_s0": {"outcome": "diverged", "final_val_loss": 2.0}, "b_lr2_s1": finished(1.0)}
    summary, low = tmp_path / "summary.json", tmp_path / "low.json"
    summary.write_text(json.dumps({"experiments": {"stage1": {"runs": runs}}}))
    low_runs = {"a_lr0_s0": finished(6.1), "a_lr0_s1": finished(5.8)}
    low.write_text(json.dumps({"experiments": {"low": {"runs": low_runs}}}))
    reports = {summary: "stage1"}
    assert best_lrs(reports, {"a": ("1", "2"), "b": ("1", "2")}, (0, 1)) == {"a": "1", "b": "1"}
    assert best_lrs(reports, {"a": ("2", "1")}, (1,)) == {"a": "2"}
    assert best_lrs({**reports, low: "low"}, {"a": ("0", "1", "2")}, (0, 1)) == {"a": "0"}   # mean 5.95
    with pytest.raises(ConfigError, match="a_lr1_s2 is not run"):
        best_lrs(reports, {"a": ("1", "2")}, (0, 2))
    with pytest.raises(ConfigError, match="no report of stage9"):
        best_lrs({summary: "stage9"}, {"a": ("1",)}, (0,))


def test_stage_2_of_i_reruns_stage_1s_arms_at_their_kept_best_lrs_on_fresh_seeds():
    load = lambda name: sweep_lib.load_spec(str(ROOT / "scripts" / "sweeps" / f"{name}.py"))
    stage1, low, stage2 = load("i_postln_lr"), load("i_postln_lr_low"), load("i_postln_best")
    runs = {}
    for name, sweep in (("postln_lr", stage1), ("postln_lr_low", low)):
        summary = json.loads((ROOT / "docs" / "i" / name / "prores_repro" / "summary.json").read_text())
        runs.update(summary["experiments"][sweep.name]["runs"])
    assert not (set(stage1.seeds) | set(low.seeds)) & set(stage2.seeds)
    assert low.common == stage1.common == stage2.common and low.config == stage1.config == stage2.config
    grid = {**stage1.arms, **low.arms}
    loss = lambda run: run["final_val_loss"] if run["outcome"] == "finished" else math.inf
    mean = lambda arm: sum(loss(runs[f"{arm}_s{s}"]) for s in (0, 1)) / 2
    for arm, overrides in stage2.arms.items():
        assert grid[arm] == overrides     # the same run as stage 1's, on other seeds
        base = arm.rpartition("_lr")[0]
        assert mean(arm) == min(mean(a) for a in grid if a.rpartition("_lr")[0] == base), arm
    assert sorted(a.rpartition("_lr")[0] for a in stage2.arms) == ["forward_false_alpha", "linear_alpha", "none"]
    assert stage2.baseline.startswith("none_lr")


def test_experiment_l_stage_1_is_the_pre_registered_recipe():
    cfg = resolved("l_stage1", "none_lr1e-3")
    assert (cfg.model.d_model, cfg.model.n_layer, cfg.model.norm, cfg.model.init) == (64, 24, "pre", "scaled")
    assert (cfg.train.steps, cfg.train.batch_size, cfg.model.seq_len, cfg.train.eval_batches) == (2000, 8, 32, 64)
    assert (cfg.optim.schedule, cfg.optim.warmup_steps, cfg.prores.warmup) == ("wsd", 60, 20)
    assert cfg.data.source == "prepared" and cfg.model.vocab_size == 8449
    arms = sweep_lib.groups(sweep_lib.load_spec(str(ROOT / "scripts" / "sweeps" / "l_stage1.py")))["l_stage1"].arms
    assert {a.rsplit("_lr", 1)[1] for a in arms} == {"5e-4", "1e-3", "2e-3", "3e-3"} and len(arms) == 11 * 4

    def deficit(arm):  # sum over blocks of the update-steps the ramp withholds: sum_l span_l / 2
        c = resolved("l_stage1", f"{arm}_lr1e-3")
        assert (c.prores.forward, c.prores.scale_updates) == (False, "alpha")
        L, T = c.model.n_layer, c.prores.warmup
        spans = {"linear": [T * l for l in range(1, L + 1)], "reverse": [T * (L - l + 1) for l in range(1, L + 1)],
                 "equal": [T * L] * L}[c.prores.schedule]
        return sum(spans) / 2

    # the pre-registration's integrals: 3000 block-steps for linear and reverse, 2880 (T = 10) for equal
    assert deficit("ramp_linear") == deficit("ramp_reverse") == 3000
    assert deficit("ramp_equal") == 2880
    mup = resolved("l_stage1", "depth_mup_lr1e-3")   # tuned at its base depth, where it is SP
    assert (mup.model.n_layer, mup.model.depth_base, mup.model.init) == (6, 6, "normal")


def test_l_width512_is_ls_five_key_arms_at_width_512_on_three_lrs_and_ls_recipe_otherwise(monkeypatch, tmp_path):
    monkeypatch.setenv("ANDREA_GPU_CORPUS", str(tmp_path / "gpu_corpus"))
    monkeypatch.syspath_prepend(str(ROOT / "scripts" / "sweeps"))
    import _l_choice
    import l_stage1
    assert _l_choice.choose()[1] == "warmup1000"   # the best warmup by L's rule, on the kept stage-1 reports
    exp = sweep_lib.groups(sweep_lib.load_spec(str(ROOT / "scripts" / "sweeps" / "l_width512.py")))["l_width512"]
    key_arms, lrs = ("none", "warmup1000", "linear", "ramp_linear", "ramp_equal"), ("3e-4", "1e-3", "3e-3")
    assert sorted(exp.arms) == sorted(f"{arm}_lr{lr}" for arm in key_arms for lr in lrs) and exp.seeds == (0,)
    settings = {**l_stage1.ARMS, **_l_choice.EXTRA_ARMS}
    for name in exp.arms:
        cfg = resolved("l_width512", name)
        assert (cfg.model.d_model, cfg.model.n_head, cfg.model.n_layer, cfg.model.norm) == (512, 8, 24, "pre"), name
        assert (cfg.data.path, cfg.train.checkpoint_every) == (str(tmp_path / "gpu_corpus"), 0), name
        # everything else is L's run of this arm at this LR: its recipe and the arm's settings
        arm, lr = name.rsplit("_lr", 1)
        ls_run = [*l_stage1.L_COMMON, *settings[arm], f"optim.lr={lr}"]
        assert cfg == config_lib.override(configs.load("tiny"), [
            *ls_run, "model.d_model=512", "model.n_head=8", f"data.path={tmp_path / 'gpu_corpus'}",
            "train.checkpoint_every=0"]), name


def test_the_corpus_check_trains_the_horizon_part_s_2000_step_runs_again():
    again, = sweep_lib.groups(sweep_lib.load_spec(str(ROOT / "scripts" / "sweeps" / "mw_w64_corpus2.py"))).values()
    horizon = sweep_lib.groups(sweep_lib.load_spec(str(ROOT / "scripts" / "sweeps" / "mh_horizon.py")))
    at_2000 = horizon["mh_horizon/steps=2000"]
    assert again.seeds == at_2000.seeds and list(again.arms) == list(at_2000.arms) == ["none", "linear", "ramp"]
    for arm in again.arms:
        assert resolved("mw_w64_corpus2", arm) == resolved("mh_horizon", arm, "mh_horizon/steps=2000")


def test_the_horizon_control_is_the_horizon_part_s_none_at_8000_steps_with_its_lr_or_warmup_changed():
    none_8000 = ("mh_horizon", "none", "mh_horizon/steps=8000")
    assert resolved("mh_control", "none_lr1e-3") == config_lib.override(resolved(*none_8000), ["optim.lr=1e-3"])
    assert resolved("mh_control", "warmup1000") == config_lib.override(
        resolved(*none_8000), ["optim.lr=4e-3", "optim.warmup_steps=1000"])
