"""One run's numbers, read from its workdir (metrics.jsonl and result.json)."""
from __future__ import annotations

import json
import math
import pathlib

import numpy as np
from andrea_jax.workdir import Workdir


def read_lines(workdir: pathlib.Path) -> list:
    path = Workdir(workdir).metrics
    if not path.is_file():
        return []
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def curve(lines, key):
    """(steps, values) of the lines that carry `key`; values is [n] or [n, L]."""
    picked = [l for l in lines if key in l]
    return np.array([l["step"] for l in picked], int), np.array([l[key] for l in picked], float)


def grad_ratio(layer_grad_norm_NL) -> np.ndarray:
    """[n]: |grad of block 1| / |grad of block L|; NaN where block L got no gradient (alpha = 0)."""
    g = np.asarray(layer_grad_norm_NL, float).reshape(len(layer_grad_norm_NL), -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(g[:, -1] > 0, g[:, 0] / np.where(g[:, -1] > 0, g[:, -1], 1.0), np.nan)


def growth_shape(rms_L) -> dict:
    """How the stream's RMS grows with depth l: R^2 of a straight-line fit of RMS against l
    ('linear') and of log RMS against l ('exponential'); the paper reports linear with ProRes."""
    y = np.asarray(rms_L, float)
    l = np.arange(1, len(y) + 1, dtype=float)
    if len(y) < 3 or np.any(y <= 0):
        return {"linear_r2": math.nan, "exponential_r2": math.nan}

    def r2(target):
        fit = np.polyval(np.polyfit(l, target, 1), l)
        total = np.sum((target - target.mean()) ** 2)
        return float(1 - np.sum((target - fit) ** 2) / total) if total > 0 else 1.0
    return {"linear_r2": r2(y), "exponential_r2": r2(np.log(y))}


def grad_ratio_curve(workdir):
    steps, g = curve(read_lines(workdir), "layer_grad_norm")
    return steps, grad_ratio(g) if len(steps) else np.zeros(0)


def run_summary(workdir) -> dict:
    workdir = pathlib.Path(workdir)
    result = json.loads((workdir / "result.json").read_text()) if (workdir / "result.json").is_file() else {}
    outcome = result.get("outcome", "not run")
    # A run still training (or failed) contributes no numbers, only its outcome.
    lines = read_lines(workdir) if outcome in ("finished", "diverged") else []
    nan = math.nan
    _, val = curve(lines, "val_loss")
    _, rms = curve(lines, "resid_rms")
    steps_g, g = curve(lines, "layer_grad_norm")
    ratio = grad_ratio(g) if len(steps_g) else np.zeros(0)
    losses = [l["loss"] for l in lines if "loss" in l]
    # ||alpha F|| / ||x|| of each sublayer, median over layers, at the last diagnostic step: how
    # much each branch moves the stream once training has settled.
    branch = {k: float(np.median(curve(lines, f"{k}_ratio")[1][-1])) if len(curve(lines, f"{k}_ratio")[0])
              else nan for k in ("attn", "mlp")}
    finite_ratio = ratio[np.isfinite(ratio) & (ratio > 0)]
    # The mechanism behind prores.scale_updates: how large the branches have grown half-way through the ProRes
    # warmup (step T L / 2), before alpha lets the stream see them, and how fast the last block moves.
    steps_b, unscaled = curve(lines, "mlp_branch_ratio")
    _, update = curve(lines, "update_ratio")
    config_path = Workdir(workdir).config
    cfg = json.loads(config_path.read_text()) if config_path.is_file() else {}
    half_warmup = cfg.get("prores", {}).get("warmup", 0) * cfg.get("model", {}).get("n_layer", 0) / 2
    finished = outcome == "finished"
    return {
        "outcome": outcome,
        "final_val_loss": float(val[-1]) if finished and len(val) else nan,
        # A diverged run's best is still what it reached before diverging.
        "best_val_loss": float(np.nanmin(val)) if len(val) else nan,
        "spike_score": float(lines[-1].get("spike_score", nan)) if finished else nan,
        "max_resid_rms": float(rms.max()) if len(rms) else nan,
        "final_resid_rms": rms[-1].tolist() if len(rms) else [],
        # How much the stream grows with depth at the end: RMS after block L over after block 1.
        "final_rms_growth": float(rms[-1][-1] / rms[-1][0]) if len(rms) and rms[-1][0] > 0 else nan,
        # Geometric mean over the diagnostic steps of |grad block 1| / |grad block L|.
        "grad_ratio_geomean": float(np.exp(np.mean(np.log(finite_ratio)))) if len(finite_ratio) else nan,
        "max_loss": float(np.nanmax(losses)) if losses else nan,
        "final_attn_ratio": branch["attn"],
        **{f"growth_{k}": v for k, v in growth_shape(rms[-1] if len(rms) else []).items()},
        "final_mlp_ratio": branch["mlp"],
        "mid_warmup_mlp_branch_ratio": float(np.median(unscaled[np.argmin(np.abs(steps_b - half_warmup))]))
        if len(steps_b) else nan,
        # mean over the diagnostic steps (the last one sits in the LR decay's tail, near 0)
        "mean_update_ratio_last_block": float(np.mean(update[:, -1])) if len(update) else nan,
        "steps_done": int(lines[-1]["step"]) if lines else 0,
        "seconds": float(result.get("seconds", nan)),
        "command": result.get("command", ""),
    }
