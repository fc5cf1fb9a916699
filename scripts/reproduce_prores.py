"""ProRes on a CPU: baseline vs linear ProRes for Pre-LN and Post-LN at tiny width and depth 24,
3 seeds each (12 runs), then docs/RESULTS.md and the plots under docs/prores_repro/.

    python scripts/reproduce_prores.py                      # ~35-45 min on 2 cores
    python scripts/reproduce_prores.py --report-only        # rewrite the report from finished runs

Each run is `python train.py --config depth_tiny_24 --workdir RUNS/ARM_sSEED --set ...` in its own
process (a diverging run cannot take the others down), run from a copy of the code taken when the
script starts (RUNS/code, with the commit and uncommitted changes in RUNS/code/SOURCE.txt), so
that editing the tree meanwhile changes nothing. Finished runs are skipped: the script resumes
where it stopped. The model and schedule settings are those of configs/_depth.py (family tiny).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import re
import shutil
import pathlib
import shlex
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from andrea_jax import config as config_lib, plot  # noqa: E402

ARMS = {  # name: (model.norm, prores.schedule, label)
    "pre_baseline": ("pre", "none", "Pre-LN baseline"),
    "pre_prores": ("pre", "linear", "Pre-LN + ProRes"),
    "post_baseline": ("post", "none", "Post-LN baseline"),
    "post_prores": ("post", "linear", "Post-LN + ProRes"),
}
COLORS = {"pre_baseline": "tab:blue", "pre_prores": "tab:green",
          "post_baseline": "tab:red", "post_prores": "tab:orange"}
# Paper (SPEC 2), C4 perplexity baseline -> ProRes.
PAPER = [("130M", "Pre-LN", 14.67, 14.30), ("130M", "Post-LN", 14.84, 14.72),
         ("350M", "Pre-LN", 12.36, 11.74), ("350M", "Post-LN", 12.74, 11.92),
         ("1.3B", "Pre-LN", 10.32, 9.86), ("1.3B", "Post-LN", 11.62, 10.53)]
PAPER_130M_RATIO = {name: pro / base for size, name, base, pro in PAPER if size == "130M"}


def run_command(config: str, workdir: pathlib.Path, arm: str, seed: int, extra: list[str]) -> list[str]:
    norm, schedule, _ = ARMS[arm]
    sets = [f"model.norm={norm}", f"prores.schedule={schedule}", f"train.seed={seed}", *extra]
    return [sys.executable, "train.py", "--config", config, "--workdir", str(workdir),
            *[a for s in sets for a in ("--set", s)]]


def is_finished(workdir: pathlib.Path, steps: int) -> bool:
    path = workdir / "metrics.jsonl"
    if not path.is_file() or not path.read_text().strip():
        return False
    last = json.loads(path.read_text().splitlines()[-1])
    return last["step"] == steps and "val_loss" in last


CODE = ("andrea_jax", "kernels", "configs", "train.py", "pyproject.toml")


def snapshot_code(dest: pathlib.Path) -> None:
    """Copies the code the runs use, so that edits to the tree while they train change nothing;
    notes the commit and the uncommitted changes it was taken from."""
    dest.mkdir(parents=True)
    for name in CODE:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout
    (dest / "SOURCE.txt").write_text(f"commit {git('rev-parse', 'HEAD')}\n{git('status', '--short')}")


def train_one(command: list[str], workdir: pathlib.Path, code: pathlib.Path) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with (workdir / "train.log").open("w") as log:
        rc = subprocess.run(command, cwd=code, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(code)}).returncode
    seconds = time.perf_counter() - start
    (workdir / "run.json").write_text(json.dumps({"returncode": rc, "seconds": seconds,
                                                  "command": shlex.join(command)}))
    return {"returncode": rc, "seconds": seconds}


def summarize_run(workdir: pathlib.Path, steps: int) -> dict:
    info = json.loads((workdir / "run.json").read_text()) if (workdir / "run.json").is_file() else {}
    lines = plot.load_run(workdir)["lines"] if (workdir / "metrics.jsonl").is_file() else []
    vals = [l for l in lines if "val_loss" in l]
    rms = [max(l["resid_rms"]) for l in lines if "resid_rms" in l]
    last_rms = next((l["resid_rms"] for l in reversed(lines) if "resid_rms" in l), None)
    grad_ratios = [l["layer_grad_norm"][0] / l["layer_grad_norm"][-1] for l in lines
                   if "layer_grad_norm" in l and l["layer_grad_norm"][-1] > 0]
    finished = bool(lines) and lines[-1]["step"] == steps and "val_loss" in lines[-1]
    log = (workdir / "train.log").read_text() if (workdir / "train.log").is_file() else ""
    log_tail = log[-2000:]
    return {
        "finished": finished,
        "diverged": not finished and "non-finite loss" in log_tail,
        "final_val_loss": vals[-1]["val_loss"] if finished else math.nan,
        "spike_score": lines[-1].get("spike_score", math.nan) if finished else math.nan,
        "max_resid_rms": max(rms) if rms else math.nan,
        "final_max_resid_rms": rms[-1] if rms else math.nan,
        # Growth with depth at the end: RMS after the last block over RMS after the first.
        "final_rms_growth": last_rms[-1] / last_rms[0] if last_rms else math.nan,
        # Median over diagnostic steps of |grad| of block 1 over |grad| of block L.
        "grad_first_over_last": float(np.median(grad_ratios)) if grad_ratios else math.nan,
        "seconds": info.get("seconds", math.nan),
        "command": info.get("command", ""),
        "log_head": log[:3000],
    }


def stats(values) -> dict:
    v = np.array([x for x in values if math.isfinite(x)], float)
    if not len(v):
        return {"n": 0, "mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan}
    return {"n": len(v), "mean": float(v.mean()), "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
            "min": float(v.min()), "max": float(v.max())}


# --- plots ----------------------------------------------------------------------------------------

def plot_arms(runs_by_arm: dict, out: pathlib.Path, warmup_end: int) -> list[pathlib.Path]:
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []

    # Validation loss, mean over seeds with the min-max band, and training loss (mean over seeds).
    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(13, 4.5))
    for arm, runs in runs_by_arm.items():
        label, color = ARMS[arm][2], COLORS[arm]
        for key, ax in (("loss", ax_train), ("val_loss", ax_val)):
            curves = [plot.series(r, key) for r in runs]
            curves = [c for c in curves if len(c[0])]
            if not curves:
                continue
            n = min(len(c[0]) for c in curves)
            steps, values = curves[0][0][:n], np.stack([c[1][:n] for c in curves])
            ax.plot(steps, values.mean(0), color=color, lw=1.5, label=f"{label} (n={len(curves)})")
            ax.fill_between(steps, values.min(0), values.max(0), color=color, alpha=0.2)
    for ax, title in ((ax_train, "training loss (mean over seeds, min-max band)"),
                      (ax_val, "validation loss (mean over seeds, min-max band)")):
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats/token)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax_val.set_ylim(top=min(ax_val.get_ylim()[1], 7.0))
    fig.tight_layout()
    written.append(out / "loss_by_arm.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    # Activation growth: residual RMS after each block, at the end of the ProRes warmup (T L) and
    # at the end of training.
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, which in zip(axes, ("warmup", "last")):
        for arm, runs in runs_by_arm.items():
            rows = []
            for r in runs:
                steps, rms = plot.series(r, "resid_rms")
                if len(steps):
                    i = int(np.argmin(np.abs(steps - warmup_end))) if which == "warmup" else -1
                    rows.append(rms[i])
                    at = steps[i]
            if rows:
                rows = np.stack(rows)
                L = rows.shape[1]
                ax.plot(np.arange(1, L + 1), rows.mean(0), color=COLORS[arm], lw=1.5, label=ARMS[arm][2])
                ax.fill_between(np.arange(1, L + 1), rows.min(0), rows.max(0), color=COLORS[arm], alpha=0.2)
                when = "end of the ProRes warmup, " if which == "warmup" else "end of training, "
                ax.set_title(f"residual RMS after each block: {when}step {at} (mean over seeds)", fontsize=10)
        ax.set_yscale("log")
        ax.set_ylabel("RMS of the residual stream")
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out / "resid_rms_by_arm.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    # Per-run figures of seed 0 of each arm.
    for arm, runs in runs_by_arm.items():
        if not runs or not any("resid_rms" in l for l in runs[0]["lines"]):
            continue
        run = runs[0]  # labelled by its folder, e.g. pre_prores_s0
        for name, draw in plot.PER_RUN.items():
            written.append(out / f"{arm}_{name}.png")
            draw(run, written[-1])
    return written


# --- report ---------------------------------------------------------------------------------------

EMBEDDED_FIGURES = ["loss_by_arm", "resid_rms_by_arm", "pre_baseline_resid_rms", "pre_prores_resid_rms",
                    "pre_prores_alpha", "pre_baseline_grad_norm", "pre_prores_grad_norm",
                    "post_baseline_grad_norm", "post_prores_grad_norm"]


def passes_note(per_run: dict, tokens_seen: int) -> str:
    """', N passes over the M training tokens', from a run's log line."""
    for r in per_run.values():
        match = re.search(r"([\d,]+) training tokens", r.get("log_head", ""))
        if match:
            n = int(match.group(1).replace(",", ""))
            return f", {tokens_seen / n:.2f} passes over the corpus's {n:,} training tokens"
    return ""


def fmt(s: dict, digits: int = 3) -> str:
    if not s["n"]:
        return "n/a"
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f} [{s['min']:.{digits}f}, {s['max']:.{digits}f}]"


def val_gaps(runs_by_arm: dict, norm: str) -> str:
    """'step: ProRes - baseline' of the seed-mean validation loss at every evaluation step."""
    means = {}
    for arm in (f"{norm}_baseline", f"{norm}_prores"):
        curves = [plot.series(r, "val_loss") for r in runs_by_arm.get(arm, [])]
        curves = [c for c in curves if len(c[0])]
        if not curves:
            return ""
        n = min(len(c[0]) for c in curves)
        means[arm] = (curves[0][0][:n], np.mean([c[1][:n] for c in curves], axis=0))
    (steps, base), (_, pro) = means[f"{norm}_baseline"], means[f"{norm}_prores"]
    n = min(len(base), len(pro))
    return ", ".join(f"{s}: {p - b:+.3f}" for s, b, p in zip(steps[:n], base[:n], pro[:n]))


def paired(per_run: dict, norm: str) -> str:
    """ProRes minus baseline per seed (same seed = same init and data order)."""
    diffs = []
    for name, r in per_run.items():
        if name.startswith(f"{norm}_prores_s"):
            base = per_run.get(name.replace("_prores_", "_baseline_"))
            if base and math.isfinite(r["final_val_loss"]) and math.isfinite(base["final_val_loss"]):
                diffs.append((name.rsplit("_", 1)[1], r["final_val_loss"] - base["final_val_loss"]))
    if not diffs:
        return ""
    lower = sum(d < 0 for _, d in diffs)
    return (", ".join(f"{seed} {d:+.3f}" for seed, d in diffs) +
            f": ProRes lower in {lower} of {len(diffs)} seeds")


def reading(summary: dict, runs_by_arm: dict, per_run: dict) -> list[str]:
    """Sentences computed from the numbers: the direction and whether it clears the seed spread."""
    out = []
    for norm, name in (("pre", "Pre-LN"), ("post", "Post-LN")):
        base, pro = summary[f"{norm}_baseline"], summary[f"{norm}_prores"]
        b, p = base["final_val_loss"], pro["final_val_loss"]
        if not (b["n"] and p["n"]):
            out.append(f"- {name}: not every arm finished (baseline {b['n']}, ProRes {p['n']} runs): "
                       f"no comparison.")
            continue
        diff = p["mean"] - b["mean"]
        spread = max(b["std"], p["std"])
        separated = p["max"] < b["min"] or b["max"] < p["min"]
        verdict = ("Level to 3 decimals" if abs(diff) < 5e-4 else "ProRes lower" if diff < 0 else "ProRes higher")
        ranges = ("one seed per arm: no spread to judge by" if min(b["n"], p["n"]) < 2 else
                  f"largest seed std {spread:.3f}; the seed ranges {'do not overlap' if separated else 'overlap'}")
        out.append(
            f"- {name}: final validation loss {b['mean']:.3f} (baseline) vs {p['mean']:.3f} (ProRes), "
            f"difference {diff:+.3f} nats = perplexity ratio {math.exp(diff):.3f} "
            f"(paper at 130M: {PAPER_130M_RATIO[name]:.3f}). "
            f"{verdict}; {ranges}.")
        rb, rp = base["max_resid_rms"], pro["max_resid_rms"]
        if rb["n"] and rp["n"]:
            out.append(f"  Max residual RMS over training: {rb['mean']:.2f} (baseline) vs {rp['mean']:.2f} "
                       f"(ProRes); final growth with depth (RMS layer L / layer 1): "
                       f"{base['final_rms_growth']['mean']:.2f} vs {pro['final_rms_growth']['mean']:.2f}. "
                       f"Spike score: {base['spike_score']['mean']:.4f} vs {pro['spike_score']['mean']:.4f}. "
                       f"Gradient norm of block 1 over block L (median over diagnostic steps): "
                       f"{base['grad_first_over_last']['mean']:.3g} vs {pro['grad_first_over_last']['mean']:.3g}.")
        pairs = paired(per_run, norm)
        if pairs:
            out.append(f"  Paired by seed, final validation loss ProRes minus baseline: {pairs}.")
        gaps = val_gaps(runs_by_arm, norm)
        if gaps:
            out.append(f"  Validation loss, ProRes minus baseline (seed means) by step: {gaps}.")
    pre, post = summary["pre_baseline"]["final_val_loss"], summary["post_baseline"]["final_val_loss"]
    if pre["n"] and post["n"]:
        out.append(f"- Post-LN against Pre-LN, both baselines: {post['mean'] - pre['mean']:+.3f} nats "
                   f"(paper, 350M at L = 24: perplexity 16.83 vs 15.21, {math.log(16.83 / 15.21):+.3f} nats).")
    return out


def setup_line(cfg) -> str:
    m, o, p, t = cfg.model, cfg.optim, cfg.prores, cfg.train
    return (f"L = {m.n_layer}, d_model {m.d_model}, {t.steps} steps of {t.batch_size} x {m.seq_len} tokens, "
            f"peak LR {o.lr:g} ({o.schedule}, {o.warmup_steps} warmup steps, decay over the last "
            f"{o.decay_fraction:.0%}), ProRes linear T = {p.warmup}")


def supplement_section(docs: pathlib.Path, name: str) -> list[str]:
    """The table and computed reading of another invocation (its docs/NAME/summary.json)."""
    path = docs / name / "summary.json"
    if not path.is_file():
        return [f"(Supplement `{name}`: no {path.name} yet.)", ""]
    data = json.loads(path.read_text())
    out = [f"### Supplement: {data['setup']}", "",
           f"Report, with its figures and the command that trains it: [{data['report']}]({data['report']}).", "",
           "| arm | runs finished | final val loss | spike score | max residual RMS | final RMS L / 1 |",
           "|---|---|---|---|---|---|"]
    for arm, s in data["arms"].items():
        out.append(f"| {ARMS[arm][2]} | {s['final_val_loss']['n']} | {fmt(s['final_val_loss'])} | "
                   f"{fmt(s['spike_score'], 4)} | {fmt(s['max_resid_rms'], 2)} | {fmt(s['final_rms_growth'], 2)} |")
    return out + ["", *data["reading"], ""]


def write_report(path: pathlib.Path, summary: dict, per_run: dict, runs_by_arm: dict,
                 figures: list[pathlib.Path], args, cfg, commands: dict, wall_seconds: float) -> None:
    m, o, p, t, g = cfg.model, cfg.optim, cfg.prores, cfg.train, cfg.diagnostics
    docs = path.parent
    rel = lambda f: os.path.relpath(f, docs)
    lines = [
        f"# {args.title}",
        "",
        "Written by `scripts/reproduce_prores.py` from the runs under "
        f"`{os.path.relpath(args.runs_dir, ROOT)}/`: {len(per_run)} runs, "
        f"{np.nansum([r['seconds'] for r in per_run.values()]) / 60:.0f} min of training in all "
        f"({args.workers} at a time; {wall_seconds / 60:.0f} min of wall-clock time).",
        "",
        "## Setup",
        "",
        f"- Model: ANDREA at tiny width: d_model {m.d_model}, {m.n_head} heads, **{m.n_layer} layers**, "
        f"MLP {m.mlp_ratio}x, sequences of {m.seq_len}, a {m.vocab_size}-token byte-level BPE trained on the "
        f"corpus, tied embeddings, init N(0, {m.init_std}), float32.",
        f"- Data: the embedded tinyshakespeare corpus; validation = its last {cfg.data.val_fraction:.0%} "
        f"({t.eval_batches} batches of {t.batch_size} x {m.seq_len} tokens, the same for every run).",
        f"- Optimizer, the paper's settings scaled down: AdamW ({o.b1}, {o.b2}), eps {o.eps}, weight decay "
        f"{o.weight_decay}, clip {o.clip_norm}, WSD learning rate, peak {o.lr}, {o.warmup_steps} warmup steps, "
        f"linear decay to 0 over the last {o.decay_fraction:.0%}; batch {t.batch_size}, **{t.steps} steps**.",
        f"- ProRes: linear, alpha(l, t) = min(t / (T l), 1) with T = {p.warmup}: every block is fully on "
        f"after T L = {p.warmup * m.n_layer} steps ({p.warmup * m.n_layer / t.steps:.0%} of the run; the paper's "
        f"T = 1000 at L = 24 and 100k steps is 24%). Baseline = schedule `none` (alpha = 1).",
        f"- Arms: Pre-LN and Post-LN, each baseline and ProRes, seeds {', '.join(map(str, args.seeds))} "
        f"(the seed sets the init and the data order; both arms of a seed see the same data).",
        f"- Spike score: the fraction of steps whose loss exceeds the mean of the previous {g.spike_window} "
        f"steps by more than {g.spike_sigmas:g} of their standard deviations (OLMo 2's rolling-window "
        "definition, upward excursions only; `andrea_jax/diagnostics.py`).",
        "",
        "## Results",
        "",
        "Mean ± sample std [min, max] over seeds. Final validation loss is in nats/token "
        "(perplexity = exp); max residual RMS is the largest RMS of the residual stream after any "
        "block at any diagnostic step (every "
        f"{g.every} steps); the last column is the RMS after the last block over the RMS after the "
        "first, at the last diagnostic step (how much the stream grows with depth).",
        "",
        "| arm | runs finished | final val loss | val perplexity | spike score | max residual RMS "
        "| final RMS, layer L / layer 1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, s in summary.items():
        ppl = s["final_val_ppl"]
        lines.append(f"| {ARMS[arm][2]} | {s['final_val_loss']['n']}/{len(args.seeds)} | {fmt(s['final_val_loss'])} | "
                     f"{fmt(ppl, 1)} | {fmt(s['spike_score'], 4)} | {fmt(s['max_resid_rms'], 2)} | "
                     f"{fmt(s['final_rms_growth'], 2)} |")
    lines += ["", "Per run:", "", "| run | final val loss | spike score | max residual RMS | minutes | status |",
              "|---|---|---|---|---|---|"]
    for name, r in per_run.items():
        status = "finished" if r["finished"] else ("diverged (non-finite loss)" if r["diverged"] else "failed")
        lines.append(f"| {name} | {r['final_val_loss']:.4f} | {r['spike_score']:.4f} | {r['max_resid_rms']:.2f} | "
                     f"{r['seconds'] / 60:.1f} | {status} |")
    notes = args.notes.read_text().strip() if args.notes and args.notes.is_file() else ""
    lines += ["", "## Reading", "", *([notes, ""] if notes else []),
              "Computed from the table:", "", *reading(summary, runs_by_arm, per_run), ""]
    lines += [
              "What this does and does not show against the paper (SPEC 2):", "",
              "- Scale. The paper trains 71M-7B Llama-style models on C4 for 100k steps of 512 x 1024 "
              f"tokens; this is a {m.d_model}-wide, {m.n_layer}-layer model trained for {t.steps} steps "
              f"of {t.batch_size} x {m.seq_len} tokens ({t.steps * t.batch_size * m.seq_len:,} tokens"
              f"{passes_note(per_run, t.steps * t.batch_size * m.seq_len)}). Absolute numbers are not comparable: "
              "the paper's perplexities (C4, 32k-token vocabulary) against ours (Shakespeare, "
              f"{m.vocab_size}-token BPE). Only the direction and the mechanics can be compared.",
              "- The paper's headline (130M, baseline -> ProRes perplexity): Pre-LN 14.67 -> 14.30 "
              "(ratio 0.975), Post-LN 14.84 -> 14.72 (0.992); at 350M Post-LN 12.74 -> 11.92 (0.936) "
              "and at 1.3B 11.62 -> 10.53 (0.906). Differences of a few percent of perplexity are "
              "about 0.01-0.1 nats: of the order of, or below, the seed spread of runs this short, "
              "so three seeds can confirm a direction only when the gap is large.",
              "- Short runs favour whatever learns fastest early. ProRes switches deep blocks off at "
              "the start, so at this step budget it can lose simply by training the deep blocks for "
              "fewer effective steps; the paper's runs are long enough for that to wash out.",
              "- What the diagnostics do show directly is the mechanism: the alpha heatmaps, the "
              "residual-RMS-by-layer curves (the paper's activation-growth figure) and the per-layer "
              "gradient norms, baseline against ProRes, in the figures below. The activation-growth "
              "comparison means something for Pre-LN only: a Post-LN block ends in a LayerNorm, so the "
              "RMS of its stream is set by the norm's gains (about 1) whatever happens inside.",
              "- Spike scores of runs this short use a short window and a few hundred scored steps; "
              "a score of 0 means no 6-sigma upward excursion was seen, not that training was smooth.",
              "- Not covered here: the other placements (Sandwich, DeepNorm, LNS), the schedule "
              "ablation (equal / reverse), the depth sweep 12-120 and the downstream evaluations. "
              "The configs exist (`configs/depth_*`, `model.norm`, `prores.schedule`); they need "
              "more compute than this script's hour.", ""]
    if args.supplement:
        lines += ["## Supplements", ""]
    for name in args.supplement:
        lines += supplement_section(args.docs, name)
    lines += ["## Figures", ""]
    embedded = [f for f in figures if f.stem in EMBEDDED_FIGURES]
    for f in sorted(embedded, key=lambda f: EMBEDDED_FIGURES.index(f.stem)):
        lines += [f"![{f.stem}]({rel(f)})", ""]
    others = [f for f in figures if f not in embedded]
    if others:
        lines += ["More, per arm (seed 0): " + ", ".join(f"[{f.stem}]({rel(f)})" for f in others) + ".", ""]
    lines += ["## Commands", "", "Everything above:", "", "```bash",
              "python scripts/reproduce_prores.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]
                                                               if a != "--report-only"),
              "```", "", "One run, as the script starts it (from the repository root):", "", "```bash"]
    first = next(iter(commands.values()), None)
    if first:
        lines.append(shlex.join(["python", *first[1:]]))
    lines += ["```", "", f"The runs ran from a copy of the code, `{os.path.relpath(args.runs_dir, ROOT)}/code` "
              "(its `SOURCE.txt` names the commit and the uncommitted changes it was taken from).", "",
              "Plots of any runs: `python -m andrea_jax.plot "
              f"{os.path.relpath(args.runs_dir, ROOT)}/pre_prores_s0 ... --out DIR`.", ""]
    path.write_text("\n".join(lines))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="depth_tiny_24")
    parser.add_argument("--runs-dir", type=pathlib.Path, default=ROOT / "runs" / "prores_repro")
    parser.add_argument("--docs", type=pathlib.Path, default=ROOT / "docs")
    parser.add_argument("--report", default="RESULTS.md", help="file name of the report, in --docs")
    parser.add_argument("--title", default="ProRes on a CPU: a small-scale reproduction")
    parser.add_argument("--notes", type=pathlib.Path, default=None,
                        help="a markdown file of hand-written reading, put at the top of the report's Reading")
    parser.add_argument("--supplement", action="append", default=[], metavar="FIGURES_DIR",
                        help="include the table of another invocation (its --figures folder in --docs)")
    parser.add_argument("--figures", default="prores_repro", help="folder of the figures, in --docs")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=2, help="runs trained at once")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="extra override for every run (e.g. train.steps=100)")
    parser.add_argument("--report-only", action="store_true", help="only rewrite the report")
    parser.add_argument("--fresh-code", action="store_true",
                        help="retake the snapshot of the code in RUNS/code (kept between resumed invocations)")
    args = parser.parse_args(argv)
    args.runs_dir = args.runs_dir.resolve()
    cfg = config_lib.validate(config_lib.override(config_lib.load(args.config), args.set))
    steps = cfg.train.steps

    # Seeds outermost: a stopped script leaves complete seeds, arms side by side.
    jobs = {f"{arm}_s{seed}": (arm, seed) for seed in args.seeds for arm in ARMS}
    commands = {name: run_command(args.config, args.runs_dir / name, arm, seed, args.set)
                for name, (arm, seed) in jobs.items()}
    start = time.perf_counter()
    if not args.report_only:
        code = args.runs_dir / "code"
        if args.fresh_code and code.exists():
            shutil.rmtree(code)
        if not code.exists():
            snapshot_code(code)
        todo = [n for n in jobs if not is_finished(args.runs_dir / n, steps)]
        print(f"{len(jobs) - len(todo)} of {len(jobs)} runs already finished; training {len(todo)} "
              f"with {args.workers} at a time", flush=True)
        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            futures = {pool.submit(train_one, commands[n], args.runs_dir / n, code): n for n in todo}
            for future in concurrent.futures.as_completed(futures):
                name, result = futures[future], future.result()
                print(f"{time.strftime('%H:%M:%S')} {name}: rc {result['returncode']}, "
                      f"{result['seconds'] / 60:.1f} min", flush=True)

        wall = args.runs_dir / "wall.json"  # summed over the invocations that trained
        before = json.loads(wall.read_text())["seconds"] if wall.is_file() else 0.0
        wall.write_text(json.dumps({"seconds": before + time.perf_counter() - start}))
    wall = args.runs_dir / "wall.json"
    wall_seconds = json.loads(wall.read_text())["seconds"] if wall.is_file() else math.nan

    per_run = {name: summarize_run(args.runs_dir / name, steps) for name in jobs}
    summary = {}
    for arm in ARMS:
        runs = [per_run[f"{arm}_s{s}"] for s in args.seeds]
        summary[arm] = {key: stats([r[key] for r in runs])
                        for key in ("final_val_loss", "spike_score", "max_resid_rms", "final_max_resid_rms",
                                    "final_rms_growth", "grad_first_over_last")}
        summary[arm]["final_val_ppl"] = stats([math.exp(r["final_val_loss"]) for r in runs])
    runs_by_arm = {arm: [plot.load_run(args.runs_dir / f"{arm}_s{s}") for s in args.seeds
                         if (args.runs_dir / f"{arm}_s{s}" / "metrics.jsonl").is_file()] for arm in ARMS}
    figures_dir = args.docs / args.figures
    figures = plot_arms(runs_by_arm, figures_dir, cfg.prores.warmup * cfg.model.n_layer)
    (figures_dir / "summary.json").write_text(json.dumps(
        {"setup": setup_line(cfg), "report": args.report, "reading": reading(summary, runs_by_arm, per_run),
         "arms": summary, "runs": {k: {f: v for f, v in r.items() if f != "log_head"} for k, r in per_run.items()}},
        indent=1))
    write_report(args.docs / args.report, summary, per_run, runs_by_arm, figures, args, cfg, commands,
                 wall_seconds)
    print(f"wrote {args.docs / args.report} and {len(figures)} figures under {figures_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
