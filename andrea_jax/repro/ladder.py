"""Compute ladders: `python -m andrea_jax.repro.ladder SPEC.py [--jobs N | --gpus-per-run K] [--slurm]
[--report]`.

SPEC.py defines `LADDER = Ladder(...)`: a base config, the rungs (each a model size as overrides:
width and/or depth), a budget per rung (tokens per parameter, or training FLOPs), the arms with
their baseline, and the seeds. Every rung's budget is resolved into train.steps before anything
runs. The rungs x arms x seeds train through the sweep runner (andrea_jax/repro/sweep.py), one
group per rung, in RUNS/NAME/RUNG/ARM_sSEED: resumable, in parts (`--rungs`, `--arms`), on
GPUs (`--gpus-per-run`) or as a Slurm array (`--slurm`).

`--report` writes the sweep's report (OUT/RESULTS.md: each rung's arms paired by seed), then fits,
per arm, L(C) = E + A C^(-alpha) to the final validation losses against training FLOPs
(andrea_jax/repro/fit.py) and writes OUT/LADDER.md, OUT/ladder/ladder.json and two figures: the
laws with intervals from a bootstrap over seeds, and each arm's effective compute multiplier against
the baseline at every rung's compute, flagged where the baseline's law is extrapolated.

Training FLOPs C = the trainer's FLOPs per token (andrea_jax/train/mfu.py, what `mfu` counts) x
steps x batch x sequence length, read from each run's own config.json. A parameter, for the
tokens-per-parameter rule, is one weight those FLOPs multiply per token: every block's matmul
weights and the tied logits projection (C is then 6 N tokens plus attention's share).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys

import numpy as np

from andrea_jax import config as config_lib, configs
from andrea_jax.errors import ConfigError
from andrea_jax.repro import experiments, fit, sweep
from andrea_jax.train import mfu
from andrea_jax.workdir import Workdir


@dataclasses.dataclass(frozen=True)
class Ladder:
    name: str
    config: str                    # the base config, as train.py --config takes it
    rungs: dict                    # rung name -> overrides of its size ({"d32": ("model.d_model=32",)})
    arms: dict                     # arm name -> overrides
    baseline: str                  # the arm every other is measured against
    seeds: tuple = (0,)
    common: tuple = ()             # overrides of every run
    tokens_per_param: float = 0.0  # > 0: each rung trains this many tokens per parameter (the module's sense)
    flops: dict | None = None      # or {rung: training FLOPs}: each rung's budget


def matmul_params(model) -> float:
    """The weights the FLOP count multiplies per token: its FLOPs per token less attention's 6 L D (T + 1),
    over 6 (andrea_jax/train/mfu.py)."""
    attention = 6.0 * model.n_layer * model.d_model * (model.seq_len + 1)
    return (mfu.model_flops_per_token(model) - attention) / 6.0


def tokens_per_step(cfg) -> int:
    return cfg.train.batch_size * cfg.model.seq_len


def training_flops(cfg) -> float:
    """C of a run: the trainer's FLOPs per token x every token it trains on."""
    return mfu.model_flops_per_token(cfg.model) * tokens_per_step(cfg) * cfg.train.steps


def check(ladder: Ladder) -> None:
    name = f"ladder {ladder.name}"
    if ladder.baseline not in ladder.arms:
        raise ConfigError(f"{name}: the baseline {ladder.baseline!r} is none of the arms {list(ladder.arms)}")
    if len(ladder.rungs) < 3:  # the law has 3 parameters
        raise ConfigError(f"{name}: a fit needs at least 3 rungs, got {list(ladder.rungs)}")
    if any("/" in r or "/" in a for r in ladder.rungs for a in ladder.arms):
        raise ConfigError(f"{name}: rung and arm names are folder names; no '/'")
    if (ladder.tokens_per_param > 0) == (ladder.flops is not None):
        raise ConfigError(f"{name}: give one budget, tokens_per_param > 0 or flops={{rung: FLOPs}}")
    if ladder.flops is not None and set(ladder.flops) != set(ladder.rungs):
        raise ConfigError(f"{name}: flops must give every rung's budget, {list(ladder.rungs)}; "
                          f"got {list(ladder.flops)}")


def rung_config(ladder: Ladder, rung: str, extra=()):
    """The config of the rung's baseline run, before its length is set: what the budget is resolved on."""
    sets = [*ladder.common, *ladder.rungs[rung], *ladder.arms[ladder.baseline], *extra]
    return config_lib.override(configs.load(ladder.config), sets)


def budget_steps(ladder: Ladder, rung: str, extra=()) -> int:
    """The rung's budget as optimizer steps, at least 1."""
    cfg = rung_config(ladder, rung, extra)
    if ladder.flops is not None:
        tokens = ladder.flops[rung] / mfu.model_flops_per_token(cfg.model)
    else:
        tokens = ladder.tokens_per_param * matmul_params(cfg.model)
    return max(1, round(tokens / tokens_per_step(cfg)))


def groups(ladder: Ladder, spec: str = "SPEC", extra=()) -> dict[str, experiments.Experiment]:
    """The ladder as the sweep runner's groups, one per rung (NAME/RUNG), each with its train.steps,
    every run's settings validated before anything runs."""
    check(ladder)
    out = {}
    for rung, rung_sets in ladder.rungs.items():
        steps = budget_steps(ladder, rung, extra)
        common = (*ladder.common, *rung_sets, f"train.steps={steps}")
        sweep._validated(f"{ladder.name} {rung}", ladder.config, common, ladder.arms, extra)
        cfg = config_lib.override(rung_config(ladder, rung, extra), [f"train.steps={steps}"])
        scale = (f"`--config {ladder.config}` with {' '.join(common)}: {matmul_params(cfg.model):.4g} parameters, "
                 f"{steps} steps of {tokens_per_step(cfg)} tokens, {training_flops(cfg):.4g} training FLOPs")
        out[f"{ladder.name}/{rung}"] = experiments.Experiment(
            name=f"{ladder.name}/{rung}", title=f"Ladder {ladder.name}: {rung}", config=ladder.config,
            arms={a: tuple(s) for a, s in ladder.arms.items()}, common=common, seeds=tuple(ladder.seeds),
            baseline=ladder.baseline, paper="a compute ladder: no claim of the paper", scale=scale,
            command=f"python -m andrea_jax.repro.ladder {spec} --report")
    return out


def load_spec(path: str) -> Ladder:
    ladder = sweep.run_spec(path, "LADDER")
    if not isinstance(ladder, Ladder):
        raise ConfigError(f"{path}: defines no LADDER = andrea_jax.repro.ladder.Ladder(...)")
    return ladder


def measured(summaries: dict, exps: dict, runs_root: pathlib.Path) -> dict:
    """{arm: {rung: {seed: (C, final validation loss)}}} of the finished runs in a sweep report's
    summaries; C from each run's config.json. A diverged run has no final loss: no point."""
    data = {}
    for name in exps:
        s = summaries.get(name)
        for arm in (s or {}).get("arms", {}):
            for seed in s["seeds"]:
                run = s["runs"][f"{arm}_s{seed}"]
                if run["outcome"] != "finished" or not math.isfinite(run["final_val_loss"]):
                    continue
                cfg = configs.from_dict(json.loads(Workdir(runs_root / name / f"{arm}_s{seed}").config.read_text()))
                data.setdefault(arm, {}).setdefault(name.split("/", 1)[1], {})[seed] = (
                    training_flops(cfg), run["final_val_loss"])
    return data


def _g(x: float, digits: int = 3) -> str:
    return "n/a" if x is None or math.isnan(x) else "∞" if math.isinf(x) else f"{x:.{digits}g}"


def _with_interval(value: float, bounds, digits: int = 3) -> str:
    return f"{_g(value, digits)} [{_g(bounds[0], digits)}, {_g(bounds[1], digits)}]"


def markdown(ladder: Ladder, exps: dict, result: dict, summaries: dict, runs: str, out: str, spec: str,
             drawn: bool = True) -> str:
    """OUT/LADDER.md: each rung's plan and losses, each arm's law, each arm's multiplier at each rung."""
    arms, base = list(ladder.arms), ladder.baseline
    lines = [f"# Compute ladder {ladder.name}", "",
             f"Written by `python -m andrea_jax.repro.ladder {spec} --report` from the runs under `{runs}/`; "
             f"numbers in `{out}/ladder/ladder.json`, each rung's arms paired by seed in `{out}/RESULTS.md`.", "",
             "C is training FLOPs: the trainer's FLOPs per token (andrea_jax/train/mfu.py) x steps x batch x "
             "sequence length. Per arm, L(C) = E + A·C^(−α) is fitted by least squares to every finished run's "
             f"final validation loss. Intervals: {result['level']:.0%} percentiles of {result['draws']} refits on "
             "seeds drawn with replacement within each rung, every arm with the same seeds. With few seeds they "
             "are narrow: on synthetic ladders of 3 seeds a rung, nominal 95% intervals held the true values 76-88% "
             "of the time (tests/test_ladder.py).", "",
             "## Rungs", "", "| rung | overrides | C (FLOPs) | " + " | ".join(f"{a}: final val loss (n)" for a in arms)
             + " |", "|---|---|---|" + "---|" * len(arms)]
    for name, exp in exps.items():
        rung, s = name.split("/", 1)[1], summaries.get(name, {})
        cells = []
        for arm in arms:
            stat = s.get("arms", {}).get(arm, {}).get("final_val_loss", {"n": 0})
            cells.append(f"{stat['mean']:.4f} ± {stat['std']:.4f} ({stat['n']})" if stat["n"] else "not run")
        planned = config_lib.override(configs.load(ladder.config), [*exp.common, *exp.arms[base]])
        lines.append(f"| {rung} | {' '.join(ladder.rungs[rung])}, {exp.common[-1]} | {_g(training_flops(planned))} | "
                     + " | ".join(cells) + " |")
    lines += ["", "## Fits", "", "| arm | E | A | α | points | RMS residual | refits that fit |",
              "|---|---|---|---|---|---|---|"]
    for arm, row in result["arms"].items():
        f = row["fit"]
        bound = " (α at the grid's end: not determined)" if f["at_bound"] else ""
        lines.append(f"| {arm} | {_with_interval(f['E'], f['E_interval'], 4)} | "
                     f"{_with_interval(f['A'], f['A_interval'])} | "
                     f"{_with_interval(f['alpha'], f['alpha_interval'])}{bound} | {f['n_points']} | "
                     f"{_g(f['rms_residual'])} | {f['draws_fitted']} of {f['draws']} |")
    low, high = result["baseline_compute"]
    lines += ["", f"## Effective compute multiplier against {base}", "",
              f"The compute {base}'s law needs to reach the arm's fitted loss at C, over C: above 1 the arm is worth "
              f"that much more compute. *Extrapolated*: {base}'s law is read outside the compute its runs span "
              f"({_g(low)} to {_g(high)} FLOPs).", "",
              "| arm | rung | C (FLOPs) | multiplier | C the baseline needs | |", "|---|---|---|---|---|---|"]
    for arm, row in result["arms"].items():
        for rung, r in row["rungs"].items():
            if "multiplier" in r:
                flag = {True: "extrapolated", False: "", None: "no fit"}[r["extrapolated"]]
                lines.append(f"| {arm} | {rung} | {_g(r['compute'])} | "
                             f"{_with_interval(r['multiplier'], r['multiplier_interval'])} | "
                             f"{_g(r['baseline_compute_needed'])} | {flag} |")
    if drawn:
        lines += ["", "![loss against compute](ladder/loss_vs_compute.png)", "",
                  "![multiplier against compute](ladder/multiplier.png)"]
    return "\n".join([*lines, ""])


def _drawable(values) -> np.ndarray:
    """Values as matplotlib draws them: an infinite multiplier (no compute reaches it) left out."""
    v = np.asarray(values, float)
    return np.where(np.isinf(v), np.nan, v)


def draw(result: dict, out: pathlib.Path) -> list[pathlib.Path]:
    """Loss against compute per arm with its law; each arm's multiplier against compute with its band,
    hollow where extrapolated."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (arm, row) in enumerate(result["arms"].items()):
        C = [r["compute"] for r in row["rungs"].values() for _ in r["losses"]]
        ax.scatter(C, [l for r in row["rungs"].values() for l in r["losses"]], color=colors(i), s=12, label=arm)
        f = row["fit"]
        if math.isfinite(f["alpha"]):
            grid = np.geomspace(min(C) / 1.5, max(C) * 1.5, 100)
            ax.plot(grid, f["E"] + f["A"] * grid ** -f["alpha"], color=colors(i), lw=1,
                    label=f"E + A C^-α: E {f['E']:.3g}, α {f['alpha']:.3g}")
    ax.set(xscale="log", xlabel="training FLOPs C", ylabel="final validation loss")
    ax.legend(fontsize=7)
    written = [out / "loss_vs_compute.png"]
    fig.tight_layout()
    fig.savefig(written[0], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.axhline(1.0, color="grey", lw=0.8)
    for i, (arm, row) in enumerate(result["arms"].items()):
        if "curve" not in row:
            continue
        c = row["curve"]
        lo, hi = _drawable(c["multiplier_interval"]).T if c["compute"] else ((), ())
        ax.plot(c["compute"], c["multiplier"], color=colors(i), lw=1, label=arm)
        ax.fill_between(c["compute"], lo, hi, color=colors(i), alpha=0.2, lw=0)
        for r in row["rungs"].values():
            m, (lo_r, hi_r) = _drawable([r["multiplier"]])[0], _drawable(r["multiplier_interval"])
            ax.errorbar([r["compute"]], [m], [[max(m - lo_r, 0)], [max(hi_r - m, 0)]], fmt="o", color=colors(i),
                        mfc="white" if r["extrapolated"] else colors(i), capsize=3)
    ax.set(xscale="log", xlabel="training FLOPs C", ylabel=f"compute multiplier against {result['baseline']}",
           title="hollow: the baseline's law extrapolated")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    written.append(out / "multiplier.png")
    fig.tight_layout()
    fig.savefig(written[1], dpi=100)
    plt.close(fig)
    return written


def report(ladder: Ladder, exps: dict, runs_root: pathlib.Path, out: pathlib.Path, spec: str,
           draws: int) -> list[pathlib.Path]:
    """The sweep's report of the rungs, then the ladder's fit: OUT/LADDER.md, OUT/ladder/ladder.json, figures."""
    from andrea_jax.repro import report as sweep_report
    sweep_report.write_all(runs_root, out, exps=exps)
    summaries = json.loads((out / "prores_repro" / "summary.json").read_text())["experiments"]
    result = fit.ladder(measured(summaries, exps, runs_root), ladder.baseline, draws)
    folder = out / "ladder"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ladder.json").write_text(json.dumps(result, indent=1))
    figures = draw(result, folder) if result["arms"] else []
    text = markdown(ladder, exps, result, summaries, sweep_report._shown(runs_root), sweep_report._shown(out), spec,
                    drawn=bool(figures))
    (out / "LADDER.md").write_text(text)
    return [out / "LADDER.md", folder / "ladder.json", *figures]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", help="a Python file defining LADDER = Ladder(...)")
    parser.add_argument("--runs", type=pathlib.Path, default=None, help="default: runs/ladders/NAME")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time on the CPU")
    parser.add_argument("--gpus-per-run", type=int, default=0, help="K > 0: one run per K GPUs")
    parser.add_argument("--gpus", default=None, help="the GPU ids to use (default: all nvidia-smi lists)")
    parser.add_argument("--slurm", action="store_true", help="write RUNS/sweep.sbatch instead of running")
    parser.add_argument("--report", action="store_true", help="only write the report of the runs so far")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="the report's folder (default RUNS/report)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="extra override of every run (part of each run's command)")
    parser.add_argument("--rungs", nargs="+", default=None, metavar="RUNG",
                        help="train only these rungs; the rest resume later")
    parser.add_argument("--arms", nargs="+", default=None, metavar="ARM",
                        help="train only these arms of each rung; the rest resume later")
    parser.add_argument("--draws", type=int, default=1000, help="bootstrap refits behind every interval")
    args = parser.parse_args(argv)

    def run() -> None:
        ladder = load_spec(args.spec)
        exps = groups(ladder, args.spec, args.set)
        runs_root = (args.runs or sweep.ROOT / "runs" / "ladders" / ladder.name).resolve()
        if unknown := sorted(set(args.rungs or ()) - set(ladder.rungs)):
            raise ConfigError(f"--rungs {' '.join(unknown)}: the ladder's rungs are {list(ladder.rungs)}")
        chosen = sweep.select(exps, args.rungs, args.arms)
        out = (args.out or runs_root / "report").resolve()
        sweep.launch_then_report(ladder.name, exps, chosen, runs_root, args,
                                 lambda: report(ladder, exps, runs_root, out, args.spec, args.draws))
    return sweep.one_line_errors(run)


if __name__ == "__main__":  # run the imported module: a spec imports its Ladder, not __main__'s
    from andrea_jax.repro import ladder as _imported
    sys.exit(_imported.main())
