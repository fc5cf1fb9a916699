"""Decide a family of pre-registered contrasts: each arm A against arm B (any summary.json, paired by
seed), with the paired-t interval, the sign-flip p and the equivalence test at a margin, both
p's Holm-adjusted over the family, and the verdict the pre-registration defines:

    python -m andrea_jax.repro.decide --margin 0.02 \\
        --contrast a RUNS/summary.json:linear RUNS/summary.json:none \\
        --contrast b RUNS/summary.json:ramp_linear RUNS/summary.json:ramp_equal

An arm is SUMMARY:ARM or SUMMARY:EXPERIMENT/ARM, as `python -m andrea_jax.repro.compare` takes it.
A verdict is "A better" / "B better" (Holm-adjusted sign-flip p <= alpha, by the mean's sign),
"level" (Holm-adjusted TOST p <= alpha: the 1 - 2 alpha interval inside +-margin), both when both
hold, else "inconclusive"."""
from __future__ import annotations

import argparse
import math
import sys

from andrea_jax.errors import ConfigError
from andrea_jax.repro import compare, stats


def paired(arm_a: dict, arm_b: dict, metric: str = "final_val_loss") -> dict:
    """{seed: A - B} over the seeds both finished. A run without the figure (diverged, failed) is
    left out and counted: the caller reports how many pairs were lost."""
    def values(arm):
        return {s: math.nan if r.get(metric) is None else float(r[metric]) for s, r in arm["seeds"].items()}
    return stats.paired_differences(values(arm_a), values(arm_b))


def verdict(mean: float, p_holm: float, tost_holm: float, alpha: float) -> str:
    """The pre-registered verdict of one contrast from its Holm-adjusted p's."""
    found = []
    if p_holm <= alpha:
        found.append("A better" if mean < 0 else "B better")
    if tost_holm <= alpha:
        found.append("level")
    return " and ".join(found) or "inconclusive"


def decide(contrasts: list[tuple[str, dict, dict]], margin: float, *, alpha: float = 0.05,
           metric: str = "final_val_loss") -> list[dict]:
    """One row per (name, arm A, arm B): n, the pairs lost, mean A - B, the paired-t 95% interval,
    the sign-flip p and its Holm adjustment over the family, the TOST p at `margin` and its Holm
    adjustment, and the verdict."""
    rows = []
    for name, arm_a, arm_b in contrasts:
        diffs = paired(arm_a, arm_b, metric)
        if len(diffs) < 2:
            raise ConfigError(f"contrast {name}: {arm_a['name']} - {arm_b['name']} has {len(diffs)} finished "
                              f"pair(s); at least 2 are needed")
        d = list(diffs.values())
        lost = len(set(arm_a["seeds"]) | set(arm_b["seeds"])) - len(d)
        rows.append({"contrast": name, "a": arm_a["name"], "b": arm_b["name"], "lost": lost,
                     **stats.paired_t(d), **stats.sign_flip_p(d), "tost_p": stats.tost(d, margin, alpha=alpha)["p"]})
    for key in ("p", "tost_p"):
        for row, adjusted in zip(rows, stats.holm([r[key] for r in rows])):
            row[f"{key}_holm"] = adjusted
    for row in rows:
        row["verdict"] = verdict(row["mean"], row["p_holm"], row["tost_p_holm"], alpha)
    return rows


def table(rows: list[dict], margin: float) -> str:
    """The rows as a markdown table."""
    lines = [f"| contrast | A − B | n (lost) | mean [paired t 95%] | sign-flip p | Holm p | TOST p at ±{margin:g} "
             f"| Holm TOST p | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['contrast']} | {r['a']} − {r['b']} | {r['n']} ({r['lost']}) | {r['mean']:+.3f} "
                     f"[{r['t_lo']:+.3f}, {r['t_hi']:+.3f}] | {r['p']:.3g} | {r['p_holm']:.3g} | {r['tost_p']:.3g} "
                     f"| {r['tost_p_holm']:.3g} | {r['verdict']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contrast", nargs=3, action="append", required=True, metavar=("NAME", "A", "B"),
                        help="a contrast A - B; arms as SUMMARY.json:[EXPERIMENT/]ARM")
    parser.add_argument("--margin", type=float, required=True, help="the equivalence margin, in the metric's units")
    parser.add_argument("--alpha", type=float, default=0.05, help="the family-wise level")
    parser.add_argument("--metric", default="final_val_loss", help="a per-run figure of summary.json")
    args = parser.parse_args(argv)
    try:
        if not args.margin > 0:
            raise ConfigError(f"--margin must be positive, got {args.margin}")
        rows = decide([(name, compare.load_arm(a), compare.load_arm(b)) for name, a, b in args.contrast],
                      args.margin, alpha=args.alpha, metric=args.metric)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(table(rows, args.margin))
    return 0


if __name__ == "__main__":
    sys.exit(main())
