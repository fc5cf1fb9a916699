"""Gathers every experiment's runs into summary.json, figures and docs/RESULTS.md.

Numbers per arm: outcomes, escape rate, final and best validation loss, paired differences to
the baseline arm (paired-t interval, exact sign-flip p, bootstrap interval), spike score, residual
RMS and the gradient ratio. The
hand-written reading (OUT/prores_repro/READING.md) and the paper comparison notes are kept beside
the numbers, so rerunning the script never loses them.
"""
from __future__ import annotations

import importlib.metadata
import json
import math
import os
import pathlib
import platform

import numpy as np

from andrea_jax.repro import experiments, figures, stats, summarize, tables
from andrea_jax.workdir import Workdir

# Nats below the unigram plateau: stuck Post-LN runs sat within 0.1 of it, trained ones 1+ below.
ESCAPE_MARGIN = 0.5
CORPUS = pathlib.Path(__file__).resolve().parent.parent / "data" / "tinyshakespeare.txt"


def unigram_plateau(workdir: pathlib.Path, val_fraction: float = 0.05) -> dict | None:
    """The unigram cross-entropy of the run's validation tokens under its training tokens' counts,
    split as the pipeline splits them (the last data.val_fraction held out): a prepared dataset's
    tokens (data.source=prepared), else the embedded corpus tokenized with the run's own tokenizer
    (one document, end-of-text id 0 after it)."""
    from tokenizers import Tokenizer
    run = Workdir(workdir)
    data = json.loads(run.config.read_text()).get("data", {}) if run.config.is_file() else {}
    val_fraction = data.get("val_fraction", val_fraction)
    if data.get("source") == "prepared":
        if data.get("mixture") or not pathlib.Path(data["path"]).is_dir():
            return None  # several datasets, or one in a bucket: no one plateau to draw
        from andrea_jax.data import token_shards
        tokens = token_shards.ShardedTokens.open(data["path"])
        ids = np.asarray(tokens[0:len(tokens)])
        vocab = Tokenizer.from_file(str(pathlib.Path(data["path"]) / "tokenizer.json")).get_vocab_size()
    else:
        tok = Tokenizer.from_file(str(run.tokenizer))
        ids, vocab = tok.encode(CORPUS.read_text()).ids + [0], tok.get_vocab_size()
    n_val = int(len(ids) * val_fraction)
    return stats.unigram_cross_entropy(ids[: len(ids) - n_val], ids[len(ids) - n_val:], vocab)


def machine(cpuinfo: pathlib.Path = pathlib.Path("/proc/cpuinfo")) -> str:
    """The CPU, its widest vector instructions and jax's version: a run repeats bit for bit only
    where all three match, so a report names them."""
    model, isa = "", ""
    if cpuinfo.is_file():
        lines = cpuinfo.read_text().splitlines()
        model = next((l.split(":", 1)[1].strip() for l in lines if l.startswith("model name")), "")
        flags = set(next((l.split(":", 1)[1].split() for l in lines if l.startswith("flags")), []))
        isa = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"))
                    if flag in flags), "")
    model = model or platform.processor() or platform.machine()
    return (f"{os.cpu_count()} CPU cores ({', '.join(filter(None, (model, isa)))}), {platform.system()}, "
            f"jax {importlib.metadata.version('jax')}")


def grad_ratio_by_step(workdirs, picks: int = 7) -> dict:
    """{step: median over seeds of |grad block 1| / |grad block L|} at a few diagnostic steps."""
    curves = [summarize.grad_ratio_curve(w) for w in workdirs]
    curves = [c for c in curves if len(c[0])]
    if not curves:
        return {}
    steps = curves[0][0]
    chosen = sorted(set(steps[np.linspace(0, len(steps) - 1, picks).astype(int)].tolist()))
    out = {}
    for step in chosen:
        values = [r[list(s).index(step)] for s, r in curves if step in s]
        values = [v for v in values if math.isfinite(v)]
        if values:
            out[str(step)] = float(np.median(values))
    return out


def summarize_experiment(exp, runs_dir: pathlib.Path) -> dict | None:
    meta_path = runs_dir / "experiment.json"
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    exp = experiments.toy(exp) if meta["toy"] else exp  # the scale and seeds the runs had
    arms = [a for a in exp.arms if a in meta["arms"]]
    per_run = {f"{a}_s{s}": summarize.run_summary(runs_dir / f"{a}_s{s}")
               for s in meta["seeds"] for a in arms}
    tokenized = next((runs_dir / n for n in per_run if Workdir(runs_dir / n).tokenizer.is_file()), None)
    plateau = unigram_plateau(tokenized) if tokenized and exp.config.startswith("depth:family=tiny") else None
    by_seed = lambda arm, key: {s: per_run[f"{arm}_s{s}"][key] for s in meta["seeds"]}
    arm_stats = {}
    for arm in arms:
        runs = [per_run[f"{arm}_s{s}"] for s in meta["seeds"]]
        row = {key: stats.describe([r[key] for r in runs]) for key in
               ("final_val_loss", "best_val_loss", "spike_score", "max_resid_rms", "final_rms_growth",
                "grad_ratio_geomean", "final_attn_ratio", "final_mlp_ratio", "growth_linear_r2",
                "growth_exponential_r2", "mid_warmup_mlp_branch_ratio", "mean_update_ratio_last_block")}
        row["outcomes"] = {o: sum(r["outcome"] == o for r in runs)
                           for o in ("finished", "diverged", "failed", "not run")}
        if plateau:  # over the runs with an outcome (one still training counts in neither)
            done = [r["final_val_loss"] for r in runs if r["outcome"] in ("finished", "diverged")]
            row["escape"] = stats.escape(done, plateau["val_cross_entropy"], ESCAPE_MARGIN)
        if arm != exp.baseline and exp.baseline in arms:
            for key in ("final_val_loss", "best_val_loss", "spike_score", "max_resid_rms", "final_rms_growth"):
                diffs = stats.paired_differences(by_seed(arm, key), by_seed(exp.baseline, key))
                row[f"paired_{key}"] = {**stats.compare(diffs.values()),
                                        "by_seed": {str(s): d for s, d in diffs.items()}}
        row["grad_ratio_by_step"] = grad_ratio_by_step([runs_dir / f"{arm}_s{s}" for s in meta["seeds"]])
        arm_stats[arm] = row
    precheck = {}
    for arm in arms[:2]:
        steps, ratio = summarize.grad_ratio_curve(runs_dir / "precheck" / f"{arm}_s0")
        if len(steps):
            precheck[arm] = {"steps": steps.tolist(), "grad_ratio": [float(r) for r in ratio]}
    cfg = next((json.loads(Workdir(runs_dir / n).config.read_text()) for n in per_run
                if Workdir(runs_dir / n).config.is_file()), None)
    shape = {"n_layer": cfg["model"]["n_layer"], "steps": cfg["train"]["steps"],
             "prores_warmup": cfg["prores"]["warmup"], "adam_horizon": 1.0 / (1.0 - cfg["optim"]["b2"])} if cfg else {}
    wall = runs_dir / "wall.json"
    return {**shape, "precheck": precheck, "title": exp.title, "config": exp.config, "scale": exp.scale,
            **({"command": exp.command} if exp.command else {}),
            "paper": exp.paper, "baseline": exp.baseline, "toy": meta["toy"], "seeds": meta["seeds"],
            "extra": meta["extra"], "jobs": meta.get("jobs", 2), "default_seeds": list(exp.seeds),
            "sweeps_t": exp.sweeps_t,
            "wall_seconds": json.loads(wall.read_text())["seconds"] if wall.is_file() else math.nan,
            "train_seconds": float(sum(r["seconds"] for r in per_run.values() if math.isfinite(r["seconds"]))),
            "plateau": plateau, "escape_margin": ESCAPE_MARGIN, "arms": arm_stats,
            "runs": {n: {k: v for k, v in r.items() if k != "final_resid_rms"} for n, r in per_run.items()}}


def draw(exp, runs_dir: pathlib.Path, summary: dict, out: pathlib.Path) -> list:
    out.mkdir(parents=True, exist_ok=True)
    arms = list(summary["arms"])
    # Runs with an outcome only: one still training would cut its arm's band short.
    lines_by_arm = {a: [summarize.read_lines(runs_dir / f"{a}_s{s}") for s in summary["seeds"]
                        if summary["runs"][f"{a}_s{s}"]["outcome"] in ("finished", "diverged")] for a in arms}
    precheck_dir = runs_dir / "precheck"
    precheck = {a: [summarize.read_lines(precheck_dir / f"{a}_s0")] for a in arms[:2]} \
        if (precheck_dir / f"{arms[0]}_s0").is_dir() else None
    plateau = summary["plateau"]["val_cross_entropy"] if summary["plateau"] else None
    if not any(lines_by_arm.values()):
        return []
    written = [out / "loss_by_arm.png"]
    figures.loss_by_arm(lines_by_arm, written[0], plateau)
    has_diagnostics = any("layer_grad_norm" in l for runs in lines_by_arm.values() for r in runs for l in r)
    if has_diagnostics:  # per-layer figures need runs trained with diagnostics.every > 0
        written.append(out / "grad_ratio.png")
        figures.grad_ratio(lines_by_arm, written[-1], precheck)
    if any("update_ratio" in l for runs in lines_by_arm.values() for r in runs for l in r):
        written.append(out / "mechanism.png")
        figures.mechanism(lines_by_arm, written[-1])
    warmup_end = summary.get("prores_warmup", 0) * summary.get("n_layer", 0)
    if has_diagnostics:
        written.append(out / "activation_growth.png")
        figures.activation_growth(lines_by_arm, written[-1], warmup_end)
    finals = {a: [summary["runs"][f"{a}_s{s}"]["final_val_loss"] for s in summary["seeds"]] for a in arms}
    if exp.sweeps_t and "n_layer" in summary and any(math.isfinite(v) for a, vs in finals.items()
                                                       if a != "none" for v in vs):
        written.append(out / "t_sweep.png")
        figures.t_sweep(finals, written[-1], summary["n_layer"], summary["steps"], summary["adam_horizon"])
    if plateau:
        written.append(out / "escape_rates.png")
        figures.escape_rates({a: s["escape"] for a, s in summary["arms"].items()}, written[-1],
                             summary["arms"][arms[0]]["escape"]["threshold"])
    return written


def _shown(path: pathlib.Path) -> str:
    """A folder as the report names it: relative to the working directory when under it."""
    return os.path.relpath(path, pathlib.Path.cwd()) if path.is_relative_to(pathlib.Path.cwd()) else str(path)


def markdown(summary: dict, out: pathlib.Path, runs: str, known: list) -> str:
    """OUT/RESULTS.md from a summary.json's contents and the kept READING.md beside it."""
    notes = out / "prores_repro" / "READING.md"
    reading = notes.read_text() if notes.is_file() else ""
    return tables.results_markdown(summary["experiments"], summary["machine"], reading, runs=runs, out=_shown(out),
                                   known=known)


def write_all(runs_root: pathlib.Path, out: pathlib.Path, toy: bool = False, exps: dict | None = None) -> list:
    """Summaries and figures of every experiment with runs under runs_root; OUT/RESULTS.md.
    exps: {name: Experiment} (a sweep's groups); default the reproduction's EXPERIMENTS."""
    figures_root = out / "prores_repro"
    summaries = {}
    known = experiments.EXPERIMENTS if exps is None else exps
    for name, exp in known.items():
        runs_dir = runs_root / name
        summary = summarize_experiment(exp, runs_dir)
        if summary is None:
            continue
        summary["figures"] = [os.path.relpath(p, out) for p in draw(exp, runs_dir, summary, figures_root / name)]
        summaries[name] = summary
    figures_root.mkdir(parents=True, exist_ok=True)
    summary_path = figures_root / "summary.json"
    summary = {"machine": machine(), "experiments": summaries}
    summary_path.write_text(json.dumps(summary, indent=1))
    report = out / "RESULTS.md"
    report.write_text(markdown(summary, out, _shown(runs_root), list(known)))
    return [report, summary_path, *[out / f for s in summaries.values() for f in s["figures"]]]


def rewrite_from_summary(out: pathlib.Path, runs: str) -> pathlib.Path:
    """OUT/RESULTS.md again from the kept OUT/prores_repro/summary.json and READING.md, without
    the runs (which are not kept in git): the tables and text come back byte for byte; the figures
    are drawn from the runs' metric lines, so they are left as they are. runs: the runs' folder as
    the first report named it."""
    summary = json.loads((out / "prores_repro" / "summary.json").read_text())
    report = out / "RESULTS.md"
    report.write_text(markdown(summary, out, runs, list(experiments.EXPERIMENTS)))
    return report
