"""docs/RESULTS.md from the experiments' summaries: the comparison with the paper, one table per
experiment, the figures and the superseded setup. Pure string building."""
from __future__ import annotations

import math

from andrea_jax.repro import experiments, stats

# The ProRes paper (arXiv 2603.05369): Table 2 (headline sizes), Table 6 (schedule ablation, 350M, L = 24) and
# Figures 1-3 (depth 12-120).
PAPER_POST_24 = {"none": 16.83, "linear": 15.15}      # equal and reverse diverge
PAPER_130M = {"pre": (14.67, 14.30), "post": (14.84, 14.72)}

SUPERSEDED = """## Superseded: the first setup (300 and 1000 steps)

Before this reproduction the script compared baseline and linear ProRes, Pre-LN and Post-LN, in
a setup far from the paper's regime: peak LR 3e-3 reached in 15 steps (300-step runs, T = 3) or
1e-3 in 50 steps (1000-step runs, T = 10). Post-LN's block-1 gradient fell to 1e-9..1e-17 of
block 24's, which those reports put down to the fast LR warmup (Experiment A above finds ProRes
doing it under a gentle warmup too), and T of 3-10 updates is below Adam's own horizon. Its
results (ProRes behind the baseline for Pre-LN, Post-LN stuck on the unigram plateau) are kept,
unchanged, as the superseded setup:
[300 steps](prores_repro_superseded/RESULTS_300_steps.md),
[1000 steps](prores_repro_superseded/RESULTS_1000_steps.md).
"""


def fmt_num(x, digits=3, sign=False) -> str:
    """x with `digits` decimals (and its sign, with `sign`); n/a for None and non-finite values."""
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def fmt_stat(s: dict, digits=3) -> str:
    if not s["n"]:
        return "n/a"
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f} (n={s['n']})"


def paired(ci: dict | None) -> dict | None:
    """A stored paired difference with its paired-t interval and sign-flip p, recomputed from the
    per-seed differences (summaries written before those statistics hold only the bootstrap)."""
    if not ci or "by_seed" not in ci:
        return ci
    d = list(ci["by_seed"].values())
    return {**ci, **stats.paired_t(d), **stats.sign_flip_p(d)}


def fmt_ci(ci: dict | None) -> str:
    """mean [paired-t 95%] (n, exact sign-flip p, the smallest p n allows)."""
    ci = paired(ci)
    if not ci or not ci["n"]:
        return "n/a"
    interval = f"[{ci['t_lo']:+.3f}, {ci['t_hi']:+.3f}]" if ci["n"] > 1 else "[no interval]"
    return f"{ci['mean']:+.3f} {interval} (n={ci['n']}, p={ci['p']:.3g}, min p {ci['p_min']:.3g})"


def fmt_boot(ci: dict | None) -> str:
    if not ci or not ci["n"]:
        return "n/a"
    return f"[{ci['lo']:+.3f}, {ci['hi']:+.3f}]"


def nats(ppl_from: float, ppl_to: float) -> str:
    return f"{math.log(ppl_to / ppl_from):+.3f} nats"


def _holds_lower(ci: dict | None) -> str:
    ci = paired(ci)
    if not ci or not ci["n"]:
        return "not measured"
    if ci["n"] < 2:
        return f"one seed ({ci['mean']:+.3g}): no interval"
    side = stats.direction(ci)
    if side == "lower":
        return "**yes** (t interval below 0)"
    if side == "higher":
        return "**no** (t interval above 0)"
    if ci["mean"] < 0:
        return "same sign, not resolved (t interval spans 0)"
    return "no (mean ≥ 0, t interval spans 0)"


def _fails(arm: dict) -> tuple[int, int]:
    """(seeds that diverged or stayed on the plateau, seeds)."""
    o, e = arm["outcomes"], arm.get("escape")
    n = sum(o.values()) - o["not run"]
    stuck = e["runs"] - e["escaped"] - o["diverged"] - o["failed"] if e else 0
    return o["diverged"] + o["failed"] + max(stuck, 0), n


def ordering(arms: dict) -> str:
    """Arms from best to worst by seed-mean final val loss; an arm with a diverged seed is last."""
    def key(a):
        s = arms[a]
        return (s["outcomes"]["diverged"] + s["outcomes"]["failed"] > 0,
                s["final_val_loss"]["mean"] if s["final_val_loss"]["n"] else math.inf)
    return " < ".join(sorted(arms, key=key))


def comparison_rows(summaries: dict) -> list:
    rows = []
    a = summaries.get("ablation")
    if a and "linear" in a["arms"]:
        arms = a["arms"]
        ci = arms["linear"].get("paired_final_val_loss")
        esc = lambda arm: (f"escaped {arms[arm]['escape']['escaped']}/{arms[arm]['escape']['runs']}"
                           if "escape" in arms.get(arm, {}) else "")
        rows.append(("6 (350M, L = 24, Post-LN)", "linear beats the baseline",
                     f"ppl {PAPER_POST_24['none']} → {PAPER_POST_24['linear']} "
                     f"({nats(PAPER_POST_24['none'], PAPER_POST_24['linear'])})",
                     f"linear − none {fmt_ci(ci)} nats; none {esc('none')}, linear {esc('linear')}",
                     _holds_lower(ci)))
        for arm in ("equal", "reverse"):
            if arm in arms:
                bad, n = _fails(arms[arm])
                lin_bad, lin_n = _fails(arms["linear"])
                d = arms[arm].get("paired_final_val_loss")
                # The paper's point is the contrast: these fail where linear trains.
                holds = ("not measured" if not n else
                         "partly: it fails, but so does linear" if bad == n and lin_bad == lin_n else
                         "**yes**" if bad == n else "partly" if bad > lin_bad else "**no**")
                rows.append(("6 (350M, L = 24, Post-LN)", f"{arm} fails", "diverges",
                             f"{arms[arm]['outcomes']['diverged']}/{n} diverged, {esc(arm)}; "
                             f"{arm} − none {fmt_ci(d)} nats", holds))
        order = ordering(arms)
        first_linear = order.split(" < ")[0] == "linear"
        worst = set(order.split(" < ")[-2:]) == {"equal", "reverse"}
        rows.append(("6 (350M, L = 24, Post-LN)", "ordering", "linear < none < equal, reverse (diverged)",
                     f"{order} (seed-mean final val loss; an arm with a diverged seed ranks last)",
                     "**yes**" if first_linear and worst else
                     "partly" if first_linear or worst else "**no**"))
        rows.append(("2 (130M, Post-LN)", "linear beats the baseline",
                     f"ppl {PAPER_130M['post'][0]} → {PAPER_130M['post'][1]} "
                     f"({nats(*PAPER_130M['post'])})", "as the first row (the only Post-LN pair run)",
                     _holds_lower(ci)))
    b = summaries.get("stability")
    if b and "linear" in b["arms"]:
        arms = b["arms"]
        ci = arms["linear"].get("paired_final_val_loss")
        rows.append(("2 (130M, Pre-LN)", "linear beats the baseline",
                     f"ppl {PAPER_130M['pre'][0]} → {PAPER_130M['pre'][1]} ({nats(*PAPER_130M['pre'])})",
                     f"linear − none at LR 3e-3: {fmt_ci(ci)} nats", _holds_lower(ci)))
        sn, sl = arms["none"]["spike_score"], arms["linear"]["spike_score"]
        rows.append(("Figs. 1-3 (depth 12-120)", "fewer loss spikes with ProRes", "spikes near zero with ProRes",
                     f"spike score none {fmt_num(sn['mean'], 4)}, linear {fmt_num(sl['mean'], 4)}; max residual RMS "
                     f"linear − none {fmt_ci(arms['linear'].get('paired_max_resid_rms'))}",
                     "not measured" if not (sl["n"] and sn["n"]) else
                     "no difference (no spike in either)" if sl["mean"] == sn["mean"] == 0 else
                     _holds_lower(arms["linear"].get("paired_spike_score"))))
        gn, gl = arms["none"]["final_rms_growth"], arms["linear"]["final_rms_growth"]
        rows.append(("Figs. 1-3 (depth 12-120)", "smaller activation growth with depth",
                     "about linear with ProRes, exponential without",
                     f"RMS layer L / layer 1 at the end: none {fmt_num(gn['mean'], 2)}, "
                     f"linear {fmt_num(gl['mean'], 2)}; "
                     f"R² of a linear / exponential fit over depth: none "
                     f"{fmt_num(arms['none']['growth_linear_r2']['mean'], 2)} / "
                     f"{fmt_num(arms['none']['growth_exponential_r2']['mean'], 2)}, "
                     f"linear {fmt_num(arms['linear']['growth_linear_r2']['mean'], 2)} / "
                     f"{fmt_num(arms['linear']['growth_exponential_r2']['mean'], 2)}",
                     _holds_lower(arms["linear"].get("paired_final_rms_growth")) +
                     "; neither arm grows exponentially" * bool(
                         arms["none"]["growth_linear_r2"]["n"] and
                         arms["none"]["growth_linear_r2"]["mean"] > arms["none"]["growth_exponential_r2"]["mean"])))
        if "gates" in arms:
            rows.append(("none published", "learned gates (ReZero) vs none", "—",
                         f"gates − none {fmt_ci(arms['gates'].get('paired_final_val_loss'))} nats", "—"))
    return rows


def comparison_table(summaries: dict) -> list:
    rows = comparison_rows(summaries)
    if not rows:
        return ["No experiment with rows in this comparison (A: `ablation`, B: `stability`) has finished "
                "runs here; each experiment below states the claim it is read against (*Against*).", ""]
    out = ["| paper table | finding | paper | ours | direction holds? |", "|---|---|---|---|---|"]
    out += [f"| {' | '.join(r)} |" for r in rows]
    return out + ["", "The paper's Table 2 (the headline sizes), Table 6 (the schedule ablation at 350M, L = 24) "
                  "and Figures 1-3 (the depth sweep 12-120); the paper's numbers are quoted from the ProRes "
                  "paper (arXiv 2603.05369). Paired differences are final validation loss, arm minus `none`, "
                  "same seed: mean [paired-t 95% interval] (n pairs, exact two-sided sign-flip p over the 2^n "
                  "sign flips, and the smallest p that n allows, 2 / 2^n: 0.25 at n = 3). A direction *holds* "
                  "only when the t interval excludes 0.", ""]


def experiment_section(name: str, s: dict) -> list:
    plateau = s["plateau"]
    seeds_flag = (f" --seeds {len(s['seeds'])}" if len(s["seeds"]) != len(s.get("default_seeds", s["seeds"]))
                  else "")
    # no wall time: a group not run yet, or a sweep stopped before its end
    wall = (f"{s['wall_seconds'] / 60:.0f} min of wall time" if math.isfinite(s["wall_seconds"])
            else "no wall time recorded")
    out = [f"## {s['title']}", "",
           f"- Scale: {s['scale']}.",
           f"- Against: {s['paper']}.",
           f"- Seeds {', '.join(map(str, s['seeds']))}; {len(s['runs'])} runs, "
           f"{s['train_seconds'] / 60:.0f} min of training in all, {wall} ({s['jobs']} runs at a time).",
           (f"- Command: `{s['command']}`." if "command" in s else
            f"- Command: `python scripts/reproduce_prores.py --experiment {name}"
            f"{seeds_flag}"
            f"{' ' + ' '.join('--set ' + x for x in s['extra']) if s['extra'] else ''}`"
            f"{' (toy)' if s['toy'] else ''}.")]
    if plateau:
        out.append(f"- Unigram plateau: the validation tokens' cross-entropy under the training tokens' "
                   f"unigram distribution is {plateau['val_cross_entropy']:.3f} nats (training entropy "
                   f"{plateau['train_entropy']:.3f}); a run *escaped* when its final validation loss is below "
                   f"{plateau['val_cross_entropy'] - s['escape_margin']:.3f} (the plateau minus "
                   f"{s['escape_margin']} nats).")
    t_arms = [a for a in s["arms"] if a != s["baseline"]] if s.get("sweeps_t") else []
    if t_arms and s.get("n_layer"):
        out.append("- T L / steps: " + ", ".join(f"{a} {int(a[1:]) * s['n_layer'] / s['steps']:.2f}" for a in t_arms) +
                   f"; T over Adam's horizon 1 / (1 - b2) = {s['adam_horizon']:g} steps: " +
                   ", ".join(f"{a} {int(a[1:]) / s['adam_horizon']:.2g}" for a in t_arms) + ".")
    for arm, p in s.get("precheck", {}).items():
        pts = [f"{st}: {r:.2g}" for st, r in zip(p["steps"], p["grad_ratio"]) if math.isfinite(r)]
        out.append(f"- Precheck, {arm}: |grad block 1| / |grad block L| by step: {', '.join(pts)}.")
    out += ["", "Mean ± sample std over seeds (n = finished seeds); "
            f"paired = arm − {s['baseline']}, same seed: mean [paired-t 95% interval] (n pairs, exact "
            "sign-flip p, smallest p n allows); the percentile bootstrap of the final difference is its own "
            "column, [min..max]-like at small n (it excludes 0 whenever the pairs share a sign). "
            "Grad ratio: |grad block 1| / |grad block L|, geometric mean over the diagnostic steps.", "",
            "| arm | finished / diverged / failed | escaped | final val loss | best val loss | "
            f"final − {s['baseline']} [paired-t 95%] | final − {s['baseline']}, bootstrap [min..max]-like at small n | "
            f"best − {s['baseline']} [paired-t 95%] | spike score | max resid RMS | RMS L / 1 | "
            "grad ratio |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, a in s["arms"].items():
        o, e = a["outcomes"], a.get("escape")
        escaped = f"{e['escaped']}/{e['runs']}" if e else "n/a"
        g = a["grad_ratio_geomean"]
        ratio = format(g["mean"], ".3g") if g["n"] else "n/a"
        out.append(f"| {arm} | {o['finished']} / {o['diverged']} / {o['failed']} | {escaped} | "
                   f"{fmt_stat(a['final_val_loss'])} | {fmt_stat(a['best_val_loss'])} | "
                   f"{fmt_ci(a.get('paired_final_val_loss'))} | {fmt_boot(a.get('paired_final_val_loss'))} | "
                   f"{fmt_ci(a.get('paired_best_val_loss'))} | "
                   f"{fmt_stat(a['spike_score'], 4)} | {fmt_stat(a['max_resid_rms'], 2)} | "
                   f"{fmt_stat(a['final_rms_growth'], 2)} | {ratio} |")
    out.append("")
    for arm, a in s["arms"].items():
        if a.get("grad_ratio_by_step"):
            out.append(f"- Gradient ratio block 1 / block L, {arm} (median over seeds) by step: " +
                       ", ".join(f"{st}: {r:.2g}" for st, r in a["grad_ratio_by_step"].items()) +
                       f"; at the end ||alpha F|| / ||x||, median over layers, seed mean: attention "
                       f"{fmt_num(a['final_attn_ratio']['mean'], 2)}, MLP {fmt_num(a['final_mlp_ratio']['mean'], 2)}" +
                       (f"; unscaled MLP branch ratio ||F|| / ||x|| (median over layers) at step T L / 2 "
                        f"{a['mid_warmup_mlp_branch_ratio']['mean']:.3g}, last block's update / parameter RMS, mean "
                        f"over the diagnostic steps {a['mean_update_ratio_last_block']['mean']:.3g}"
                        if a.get("mid_warmup_mlp_branch_ratio", {}).get("n") else "") + ".")
    out += ["", "Per run: " + "; ".join(
        f"{n} {r['outcome']}, final {fmt_num(r['final_val_loss'])}, best {fmt_num(r['best_val_loss'])}"
        f" ({r['seconds'] / 60:.1f} min)" for n, r in s["runs"].items()) + ".", ""]
    out += [f"![{p.rsplit('/', 1)[-1][:-4]}]({p})" + "\n" for p in s["figures"]]
    return out


def results_markdown(summaries: dict, machine: str, notes: str, runs: str = "runs/prores_repro",
                     out: str = "docs", known: list | None = None) -> str:
    """The report. runs, out: the --runs and --out folders, as the reader should see them;
    known: the experiments that could have runs (default: the reproduction's)."""
    wall = sum(s["wall_seconds"] for s in summaries.values() if math.isfinite(s["wall_seconds"]))
    lines = ["# ProRes on a CPU: the paper's Post-LN ablation, Pre-LN stability and the T sweep, small"
             if runs == "runs/prores_repro" else f"# ProRes on a CPU: the runs under `{runs}/`", "",
             "Written by `scripts/reproduce_prores.py` (modules in `andrea_jax/repro/`) from the runs under "
             f"`{runs}/`; numbers in `{out}/prores_repro/summary.json`.",
             f"Machine: {machine}, shared with other work while these ran; "
             f"{wall / 60:.0f} min of wall time over the experiments below "
             f"({', '.join(summaries) or 'none yet'}).", ""]
    if notes.strip():
        lines += ["## Reading", "", notes.strip(), ""]
    lines += ["## Against the paper", "", *comparison_table(summaries)]
    for name, s in summaries.items():
        lines += experiment_section(name, s)
    not_run = [n for n in (experiments.EXPERIMENTS if known is None else known) if n not in summaries]
    if not_run and all(n in experiments.EXPERIMENTS for n in not_run):  # a sweep's groups have no command each
        lines += ["## Not run here", "", f"No runs under `{runs}/` for: " + ", ".join(
            f"`python scripts/reproduce_prores.py --experiment {n}`" for n in not_run) + ".", ""]
    if "ablation" in summaries:  # the superseded setup was Experiment A's
        lines += [SUPERSEDED]
    return "\n".join(lines)
