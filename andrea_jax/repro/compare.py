"""Pair arms across reports: each arm against a baseline from any summary.json (another sweep's
included), seed by seed, with the paired-t interval and the exact sign-flip p, and the settings in
which each arm's runs differ from the baseline's (a pairing is only fair when nothing else does):

    python -m andrea_jax.repro.compare --baseline docs/h/prores_or_warmup/prores_repro/summary.json:none_warmup312 \\
        docs/h/depth_params/prores_repro/summary.json:forward_false_alpha

An arm is SUMMARY:ARM, or SUMMARY:EXPERIMENT/ARM when the summary holds several experiments."""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import shlex
import sys

from andrea_jax.errors import ConfigError
from andrea_jax.repro import stats

RUN_IDENTITY = ("train.seed",)  # what pairs the runs, never a difference between arms


def load_arm(spec: str) -> dict:
    """{"name", "seeds": {seed: run summary}} of the arm that SUMMARY:[EXPERIMENT/]ARM names."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ConfigError(f"{spec!r}: an arm is SUMMARY.json:ARM or SUMMARY.json:EXPERIMENT/ARM")
    try:
        experiments = json.loads(pathlib.Path(path).read_text())["experiments"]
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"{path}: not a report's summary.json ({e})") from None
    exp_name, _, arm = name.rpartition("/")
    candidates = {e: x for e, x in experiments.items() if arm in x["arms"] and exp_name in ("", e)}
    if len(candidates) != 1:
        where = {e: list(x["arms"]) for e, x in experiments.items()}
        raise ConfigError(f"{spec}: {'no' if not candidates else 'more than one'} experiment has arm {arm!r} "
                          f"(arms by experiment: {where}); name it as EXPERIMENT/ARM")
    exp = next(iter(candidates.values()))
    return {"name": name, "seeds": {s: exp["runs"][f"{arm}_s{s}"] for s in exp["seeds"]}}


def settings(command: str) -> dict:
    """The run's `--set` overrides and its config, the last of a repeated key winning (as train.py
    applies them), without the workdir and what pairs runs."""
    words = shlex.split(command)
    out = {"config": words[words.index("--config") + 1]} if "--config" in words else {}
    for flag, value in zip(words, words[1:]):
        if flag == "--set":
            key, _, v = value.partition("=")
            out[key] = v
    return {k: v for k, v in out.items() if k not in RUN_IDENTITY}


def differences(arm: dict, baseline: dict) -> list[str]:
    """KEY=ARM_VALUE (baseline BASELINE_VALUE) for every setting in which the arm's runs differ from
    the baseline's; it raises if the arm's own runs differ among themselves."""
    mine = [settings(r["command"]) for r in arm["seeds"].values()]
    if any(m != mine[0] for m in mine):
        raise ConfigError(f"{arm['name']}: its runs differ in more than the seed")
    theirs = settings(next(iter(baseline["seeds"].values()))["command"])
    return [f"{k}={mine[0].get(k, '(unset)')} (baseline {theirs.get(k, '(unset)')})"
            for k in sorted(set(mine[0]) | set(theirs)) if mine[0].get(k) != theirs.get(k)]


def compare_arms(baseline: dict, arms: list[dict], metric: str = "final_val_loss") -> list[dict]:
    """One row per arm: its mean, the paired comparison with the baseline over their common seeds
    (stats.compare) and the settings that differ."""
    def values(arm):  # NaN for a run without the figure (one that did not finish)
        known = {k for r in arm["seeds"].values() for k, v in r.items() if isinstance(v, (int, float))}
        if metric not in known:
            raise ConfigError(f"{arm['name']}: no run has {metric!r}; per-run figures: {sorted(known)}")
        return {s: math.nan if r.get(metric) is None else float(r[metric]) for s, r in arm["seeds"].items()}

    base = values(baseline)
    rows = []
    for arm in arms:
        mine = values(arm)
        diffs = stats.paired_differences(mine, base)
        if not diffs:
            raise ConfigError(f"{arm['name']} (seeds {sorted(mine)}) and the baseline {baseline['name']} "
                              f"(seeds {sorted(base)}) share no seed that both finished")
        compared = stats.compare(diffs.values())
        rows.append({**compared, "arm": arm["name"], "mean": stats.describe(mine.values())["mean"],
                     "mean_diff": compared["mean"], "seeds": sorted(diffs),
                     "differs": differences(arm, baseline)})
    return rows


def table(baseline: dict, rows: list[dict], metric: str) -> str:
    """The rows as a markdown table under a line naming the baseline and its mean."""
    base_mean = stats.describe(r.get(metric) for r in baseline["seeds"].values())["mean"]
    lines = [f"baseline {baseline['name']}: mean {metric} {base_mean:.3f}", "",
             "| arm | mean | arm − baseline [paired t 95%] | n | sign-flip p (smallest n allows) "
             "| differs from the baseline in |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['arm']} | {r['mean']:.3f} | {r['mean_diff']:+.3f} [{r['t_lo']:+.3f}, {r['t_hi']:+.3f}] "
                     f"| {r['n']} | {r['p']:.4g} ({r['p_min']:.4g}) | {'; '.join(r['differs']) or 'nothing'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arms", nargs="+", help="SUMMARY.json:[EXPERIMENT/]ARM")
    parser.add_argument("--baseline", required=True, help="SUMMARY.json:[EXPERIMENT/]ARM")
    parser.add_argument("--metric", default="final_val_loss", help="a per-run figure of summary.json")
    args = parser.parse_args(argv)
    try:
        baseline = load_arm(args.baseline)
        rows = compare_arms(baseline, [load_arm(a) for a in args.arms], args.metric)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(table(baseline, rows, args.metric))
    return 0


if __name__ == "__main__":
    sys.exit(main())
