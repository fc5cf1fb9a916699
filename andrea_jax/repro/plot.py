"""Plots of training runs from their metrics.jsonl: `python -m andrea_jax.repro.plot WORKDIR... --out DIR`.

Draws, into DIR:
- loss.png: training and validation loss of every run, overlaid;
- RUN_alpha.png: the effective alpha of every layer over training (heatmap, layer x step);
- RUN_resid_rms.png: RMS of the residual stream after each block, by layer, at several steps
  (the paper's activation-growth figure), and as a heatmap;
- RUN_grad_norm.png: gradient norm of each block's parameters (heatmap, log colour scale);
- RUN_branch_ratio.png: ||alpha F|| / ||x|| of the attention and MLP branches (heatmaps).
The per-layer figures need a run trained with `diagnostics.every > 0`.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402

from andrea_jax.errors import PlotError  # noqa: E402
from andrea_jax.workdir import Workdir  # noqa: E402




def load_run(workdir) -> dict:
    """{'label', 'lines', 'config'} of one workdir (config is {} when config.json is absent)."""
    workdir = pathlib.Path(workdir)
    path = Workdir(workdir).metrics
    if not path.is_file():
        raise PlotError(f"{workdir} has no metrics.jsonl: is it the workdir of a training run?")
    lines = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
    if not lines:
        raise PlotError(f"{path} is empty")
    config_path = Workdir(workdir).config
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    return {"label": workdir.name, "lines": lines, "config": config, "workdir": workdir}


def series(run: dict, key: str):
    """(steps, values) of the lines that carry `key`; values is [n] or [n, L]."""
    lines = [l for l in run["lines"] if key in l]
    return np.array([l["step"] for l in lines]), np.array([l[key] for l in lines], dtype=float)


def plot_losses(runs, path, *, colors=None) -> None:
    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for i, run in enumerate(runs):
        color = colors[i] if colors else None
        steps, loss = series(run, "loss")
        ax_train.plot(steps, loss, color=color, lw=1, label=run["label"])
        steps, val = series(run, "val_loss")
        if len(steps):
            ax_val.plot(steps, val, color=color, marker="o", ms=3, lw=1, label=run["label"])
    for ax, title in ((ax_train, "training loss"), (ax_val, "validation loss")):
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax_train.set_ylabel("cross-entropy (nats/token)")
    _legend(ax_val, len(runs))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _legend(ax, n):
    if n <= 16:
        ax.legend(fontsize=7)


def _edges(steps):
    """Cell edges around each logged step (midpoints between neighbours)."""
    steps = np.asarray(steps, float)
    if len(steps) == 1:
        return np.array([steps[0] - 0.5, steps[0] + 0.5])
    mid = (steps[1:] + steps[:-1]) / 2
    return np.concatenate([[steps[0] - (mid[0] - steps[0])], mid, [steps[-1] + (steps[-1] - mid[-1])]])


def _heatmap(ax, fig, steps, values_NL, title, *, log=False, cmap="viridis"):
    data = values_NL.T  # layers on the vertical axis, layer 1 at the bottom
    norm = None
    if log:
        positive = data[data > 0]
        if positive.size:
            norm = LogNorm(vmin=positive.min(), vmax=positive.max())
    im = ax.pcolormesh(_edges(steps), np.arange(data.shape[0] + 1) + 0.5,
                       np.where(data > 0, data, np.nan) if log else data, cmap=cmap, norm=norm)
    fig.colorbar(im, ax=ax)
    ax.set_xlabel("step")
    ax.set_ylabel("layer")
    ax.set_title(title)


def _diagnostic(run, key):
    steps, values = series(run, key)
    if not len(steps):
        raise PlotError(f"run {run['label']} has no per-layer diagnostics ({key}); "
                        f"train it with --set diagnostics.every=N")
    return steps, values


def plot_alpha_heatmap(run, path) -> None:
    steps, alpha = _diagnostic(run, "alpha")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _heatmap(ax, fig, steps, alpha, f"{run['label']}: effective alpha(l, t)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_resid_rms(run, path, *, n_curves: int = 8) -> None:
    steps, rms = _diagnostic(run, "resid_rms")
    L = rms.shape[1]
    fig, (ax_lines, ax_map) = plt.subplots(1, 2, figsize=(13, 4.5))
    picks = np.unique(np.linspace(0, len(steps) - 1, min(n_curves, len(steps))).astype(int))
    cmap = plt.get_cmap("plasma")
    for j, i in enumerate(picks):
        ax_lines.plot(np.arange(1, L + 1), rms[i], color=cmap(j / max(1, len(picks) - 1)),
                      lw=1.2, label=f"step {steps[i]}")
    ax_lines.set_yscale("log")
    ax_lines.set_xlabel("layer")
    ax_lines.set_ylabel("RMS of residual stream after block")
    ax_lines.set_title(f"{run['label']}: activation growth with depth")
    ax_lines.grid(alpha=0.3, which="both")
    ax_lines.legend(fontsize=7)
    _heatmap(ax_map, fig, steps, rms, "residual RMS (log colour)", log=True, cmap="magma")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_grad_norms(run, path) -> None:
    steps, g = _diagnostic(run, "layer_grad_norm")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _heatmap(ax, fig, steps, g, f"{run['label']}: block gradient norm (log colour)", log=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_branch_ratios(run, path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, key in zip(axes, ("attn_ratio", "mlp_ratio")):
        steps, ratio = _diagnostic(run, key)
        _heatmap(ax, fig, steps, ratio, f"{run['label']}: {key.split('_')[0]} ||alpha F|| / ||x||", log=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


PER_RUN = {"alpha": plot_alpha_heatmap, "resid_rms": plot_resid_rms,
           "grad_norm": plot_grad_norms, "branch_ratio": plot_branch_ratios}


def unique_labels(runs) -> None:
    """Runs from folders of the same name get their parent's name in front."""
    names = [r["label"] for r in runs]
    for r in runs:
        if names.count(r["label"]) > 1:
            r["label"] = f"{r['workdir'].parent.name}_{r['workdir'].name}"


def plot_all(workdirs, out) -> list[pathlib.Path]:
    """Draws every figure for the given runs into `out`; returns the files written."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = [load_run(w) for w in workdirs]
    unique_labels(runs)
    written = [out / "loss.png"]
    plot_losses(runs, written[0])
    for run in runs:
        if not any("resid_rms" in l for l in run["lines"]):
            print(f"{run['label']}: no per-layer diagnostics, only the loss curves", file=sys.stderr)
            continue
        for name, draw in PER_RUN.items():
            path = out / f"{run['label']}_{name}.png"
            draw(run, path)
            written.append(path)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdirs", nargs="+", help="workdirs of training runs (with metrics.jsonl)")
    parser.add_argument("--out", required=True, help="folder for the PNG files")
    args = parser.parse_args(argv)
    try:
        written = plot_all(args.workdirs, args.out)
    except PlotError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
