"""The reproduction's figures, one function each: loss by arm with a seed band, escape rates,
the block-1 / block-L gradient ratio over training, activation growth with depth, and the
mechanism behind prores.scale_updates (unscaled branch ratios and update-to-parameter ratios over training)."""
from __future__ import annotations

import pathlib

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from andrea_jax.repro import summarize  # noqa: E402


def _color(i: int):
    return plt.get_cmap("tab10")(i % 10)


def _save(fig, path: pathlib.Path) -> None:
    """A legend on every panel that has labelled lines, then the file."""
    for ax in fig.axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _split(curves):
    """(steps, [n, k] values of the full-length curves), [the shorter curves]: a diverged run
    stops early and is drawn on its own rather than cutting the band short."""
    curves = [c for c in curves if len(c[0])]
    if not curves:
        return None, None, []
    n = max(len(c[0]) for c in curves)
    full = [c for c in curves if len(c[0]) == n]
    return full[0][0], np.stack([c[1] for c in full]), [c for c in curves if len(c[0]) < n]


def loss_by_arm(lines_by_arm: dict, path: pathlib.Path, plateau: float | None = None) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, key in zip(axes, ("loss", "val_loss")):
        for i, (arm, runs) in enumerate(lines_by_arm.items()):
            steps, values, short = _split([summarize.curve(lines, key) for lines in runs])
            if steps is None:
                continue
            ax.plot(steps, values.mean(0), color=_color(i), lw=1.5, label=f"{arm} (n={len(values)})")
            ax.fill_between(steps, values.min(0), values.max(0), color=_color(i), alpha=0.2)
            for j, (s, v) in enumerate(short):  # stopped early: diverged
                ax.plot(s, v, color=_color(i), lw=1, ls="--", label=f"{arm}, diverged" if j == 0 else None)
        if plateau is not None:
            ax.axhline(plateau, color="k", ls=":", lw=1, label="unigram plateau")
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats/token)")
        ax.set_title(f"{'training' if key == 'loss' else 'validation'} loss: seed mean, min-max band", fontsize=10)
        ax.grid(alpha=0.3)
    _save(fig, path)


def escape_rates(escapes: dict, path: pathlib.Path, threshold: float) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    arms = list(escapes)
    rates = [escapes[a]["rate"] for a in arms]
    ax.bar(arms, rates, color=[_color(i) for i in range(len(arms))])
    for i, a in enumerate(arms):
        ax.text(i, rates[i] + 0.02, f"{escapes[a]['escaped']}/{escapes[a]['runs']}", ha="center", fontsize=9)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("fraction of seeds")
    ax.set_title(f"escaped the unigram plateau (final val loss < {threshold:.2f})", fontsize=10)
    _save(fig, path)


def grad_ratio(lines_by_arm: dict, path: pathlib.Path, precheck: dict | None = None) -> None:
    panels = [("main runs", lines_by_arm)] + ([("precheck", precheck)] if precheck else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, (title, by_arm) in zip(axes[0], panels):
        for i, (arm, runs) in enumerate(by_arm.items()):
            for j, lines in enumerate(runs):
                steps, g = summarize.curve(lines, "layer_grad_norm")
                if len(steps):
                    ratio = summarize.grad_ratio(g)
                    ax.plot(steps, ratio, color=_color(i), lw=1, alpha=0.8, label=arm if j == 0 else None)
        ax.set_yscale("log")
        ax.axhline(1.0, color="k", lw=0.8, ls=":")
        ax.set_xlabel("step")
        ax.set_ylabel("|grad block 1| / |grad block L|")
        ax.set_title(f"{title}: one line per seed", fontsize=10)
        ax.grid(alpha=0.3, which="both")
    _save(fig, path)


def activation_growth(lines_by_arm: dict, path: pathlib.Path, warmup_end: int) -> None:
    """RMS of the residual stream after each block, seed mean and band, at the end of the ProRes
    warmup (T L) and at the last diagnostic step."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, which in zip(axes, ("warmup", "last")):
        at = None
        for i, (arm, runs) in enumerate(lines_by_arm.items()):
            rows = []
            for lines in runs:
                steps, rms = summarize.curve(lines, "resid_rms")
                if len(steps):
                    k = int(np.argmin(np.abs(steps - warmup_end))) if which == "warmup" else -1
                    rows.append(rms[k])
                    at = steps[k]
            if rows:
                rows = np.stack(rows)
                layers = np.arange(1, rows.shape[1] + 1)
                ax.plot(layers, rows.mean(0), color=_color(i), lw=1.5, label=arm)
                ax.fill_between(layers, rows.min(0), rows.max(0), color=_color(i), alpha=0.2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("layer")
        ax.set_ylabel("RMS of the residual stream after the block")
        when = "end of the ProRes warmup (T L)" if which == "warmup" else "last diagnostic step"
        ax.set_title(f"activation growth with depth: {when}, step {at}", fontsize=10)
        ax.grid(alpha=0.3, which="both")
    _save(fig, path)


def t_sweep(final_by_arm: dict, path: pathlib.Path, n_layer: int, steps: int, adam_horizon: float) -> None:
    """Final validation loss against T L / steps (the fraction of the run before every block is
    fully on), one point per seed; the `none` arm as a band. Top axis: T over Adam's horizon."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    base = [v for v in final_by_arm.get("none", []) if np.isfinite(v)]
    final_by_arm = {a: [v for v in vs if np.isfinite(v)] for a, vs in final_by_arm.items()}
    if base:
        ax.axhspan(min(base), max(base), color="gray", alpha=0.3, label=f"none (n={len(base)})")
    for arm, values in final_by_arm.items():
        if arm.startswith("T") and values:
            x = int(arm[1:]) * n_layer / steps
            ax.scatter([x] * len(values), values, color="tab:blue", s=20)
            ax.scatter([x], [np.nanmean(values)], color="tab:red", marker="_", s=200)
    ax.set_xscale("log")
    ax.set_xlabel("T L / steps")
    ax.set_ylabel("final validation loss (nats/token)")
    top = ax.secondary_xaxis("top", functions=(lambda u: u * steps / n_layer / adam_horizon,
                                               lambda v: v * adam_horizon * n_layer / steps))
    top.set_xlabel(f"T / Adam's horizon 1 / (1 - b2) = {adam_horizon:g} steps")
    ax.grid(alpha=0.3, which="both")
    _save(fig, path)


def mechanism(lines_by_arm: dict, path: pathlib.Path) -> None:
    """Over training, seed median: the unscaled branch ratio ||F|| / ||x|| of the attention and
    MLP sublayers and the update-to-parameter RMS ratio, for the middle block (dashed) and the
    last (solid). Adam takes full-size steps in a block whose alpha is small; these show it."""
    keys = [("attn_branch_ratio", "||Attn(x)|| / ||x|| (alpha divided out)"),
            ("mlp_branch_ratio", "||MLP(x)|| / ||x|| (alpha divided out)"),
            ("update_ratio", "RMS(update) / RMS(parameters), per block")]
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.5))
    for ax, (key, title) in zip(axes, keys):
        for i, (arm, runs) in enumerate(lines_by_arm.items()):
            steps, values, _ = _split([summarize.curve(lines, key) for lines in runs])
            if steps is None:
                continue
            median = np.median(values, axis=0)  # [n, L]
            L = median.shape[1]
            for l, ls in ((L // 2, "--"), (L, "-")):
                ax.plot(steps, median[:, l - 1], color=_color(i), ls=ls, lw=1.2,
                        label=f"{arm}, block {l}" if l == L else None)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(f"{title}: block L solid, L/2 dashed", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    _save(fig, path)
