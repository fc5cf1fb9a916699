"""Member-steps per second of a population's vmapped step against solo steps, on equal work.

    python benchmarks/population.py                  # 8 members, depth:family=tiny,layers=24 at 8 x 32 tokens
    python benchmarks/population.py --members 2 --steps 2 --set model.n_layer=2      # a quick look
    python benchmarks/population.py --cores 0 --json results.jsonl                   # on a GPU (gpu_all.sh)

The same model, the same batch and the same number of member-steps on each side, synthetic tokens,
2 warm-up steps per side, every timed step waited for:
- population: `--steps` steps of N members (one vmapped, jitted step: andrea_jax.train.population,
  the members at N learning rates), on every core;
- solo: N x `--steps` solo steps (steps.make_train_step, one compiled step taking the N solo states in
  turn) in this process, on every core;
- solo processes: the same N x `--steps` solo steps split over one process per core (`--cores`),
  started at once, each pinned to its core (taskset, where there is one) with XLA single-threaded:
  what the sweep runner does on a CPU (`--jobs`). Its member-steps per second sum the processes'.
  `--cores 0` leaves this side out: on an accelerator the processes would share one chip.
Printed per side: the compile time, the median step, member-steps per second; then the population
against each solo side. On a CPU the step is compute-bound and the cores are already busy, so the
population is expected to lose to one process per core; on an accelerator a small model leaves the
chip idle, which a population fills (docs/POPULATIONS.md).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from andrea_jax import config as config_lib, configs  # noqa: E402
from andrea_jax.train import population, steps  # noqa: E402

DEFAULT_SETS = ("model.seq_len=32", "train.batch_size=8", "train.data_seed=0", "diagnostics.every=0")
ONE_THREAD = "--xla_cpu_multi_thread_eigen=false"  # and the process pinned to its core (taskset)


def timed(step, state, tokens, n: int) -> tuple[object, list[float]]:
    """n calls of step(state, tokens), each waited for: the final state and each call's seconds."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        state, metrics = step(state, tokens)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - t0)
    return state, times


def compiled(step, state, tokens) -> tuple[object, float]:
    """The step compiled for these arguments, and the seconds it took."""
    t0 = time.perf_counter()
    out = step.lower(state, tokens).compile()
    return out, time.perf_counter() - t0


def solo_side(cfg, mesh, tokens, n: int, rounds: int) -> tuple[float, list[float]]:
    """(compile seconds, step seconds) of `rounds` rounds of one step of each of n solo states: the
    states of `cfg` at n seeds, so that one compiled step takes them all (an LR changes no work, and
    another config's optimizer would be another pytree, so another compile)."""
    states = [steps.create_state(cfg, jax.random.key(i), mesh) for i in range(n)]
    step, seconds = compiled(steps.make_train_step(cfg, mesh), states[0], tokens)
    states[0], _ = timed(step, states[0], tokens, 2)
    times = []
    for _ in range(rounds):
        for i in range(n):
            states[i], (t,) = timed(step, states[i], tokens, 1)
            times.append(t)
    return seconds, times


def per_core_side(argv: list[str], cores: int, solo_steps: int) -> list[float]:
    """Each process's median step, of `cores` processes of this script with --worker, one per core."""
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {ONE_THREAD}".strip()}
    pin = (lambda core: ["taskset", "-c", str(core)]) if shutil.which("taskset") else (lambda core: [])
    procs = [subprocess.Popen([*pin(core), sys.executable, __file__, *argv, "--worker", str(solo_steps)], env=env,
                              text=True, stdout=subprocess.PIPE) for core in sorted(os.sched_getaffinity(0))[:cores]]
    return [float(p.communicate()[0].split()[-1]) for p in procs]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="depth:family=tiny,layers=24")
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="timed population steps (solo: N times as many)")
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)), help="solo processes, one per core")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help=f"override (after {' '.join(DEFAULT_SETS)})")
    parser.add_argument("--json", help="append one JSON line (phase population) to this file")
    parser.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)  # a solo process: its steps
    args = parser.parse_args(argv)
    base = config_lib.validate(config_lib.override(configs.load(args.config), [*DEFAULT_SETS, *args.set]))
    n = args.members
    cfgs = population.member_configs(base, [[f"train.seed={i}", f"optim.lr={base.optim.lr * 1.25 ** i:.6g}"]
                                            for i in range(n)])
    mesh = steps.make_mesh(cfgs[0])
    tokens = jax.random.randint(jax.random.key(0), (base.train.batch_size, base.model.seq_len + 1), 0,
                                base.model.vocab_size)
    if args.worker:
        print(statistics.median(solo_side(cfgs[0], mesh, tokens, 1, args.worker)[1]))
        return 0
    solo_compile, solo_times = solo_side(cfgs[0], mesh, tokens, n, args.steps)
    pop_state = population.create_states(cfgs, mesh)
    pop_step, pop_compile = compiled(population.make_train_step(cfgs, mesh), pop_state, tokens)
    pop_state, _ = timed(pop_step, pop_state, tokens, 2)
    _, pop_times = timed(pop_step, pop_state, tokens, args.steps)
    own = list(sys.argv[1:] if argv is None else argv)
    solo_steps = -(-n * args.steps // args.cores) if args.cores else 0
    core_medians = per_core_side(own, args.cores, solo_steps) if args.cores else []

    rates = {"solo": 1 / statistics.median(solo_times), "population": n / statistics.median(pop_times)}
    if core_medians:
        rates["solo processes"] = sum(1 / m for m in core_medians)
    n_params = sum(int(p.size) for p in jax.tree.leaves(pop_state.params)) // n
    print(f"population benchmark: {n} members of {' '.join([args.config, *args.set])} ({n_params:,} parameters each), "
          f"batch {base.train.batch_size} x {base.model.seq_len} tokens, {jax.devices()[0].platform}", flush=True)
    print(f"population: compile {pop_compile:.1f} s, step {1e3 * statistics.median(pop_times):.1f} ms (median of "
          f"{len(pop_times)} steps of {n} members), {rates['population']:.1f} member-steps/s")
    print(f"solo:       compile {solo_compile:.1f} s, step {1e3 * statistics.median(solo_times):.1f} ms (median of "
          f"{len(solo_times)}), {rates['solo']:.1f} member-steps/s")
    if core_medians:
        print(f"solo processes: {args.cores}, one per core, steps " + ", ".join(f"{1e3 * m:.1f}" for m in core_medians)
              + f" ms (median of {solo_steps} each), {rates['solo processes']:.1f} member-steps/s")
    ratios = {side: rates["population"] / rates[side] for side in rates if side != "population"}
    for side, ratio in ratios.items():
        print(f"population / {side}: {ratio:.2f}x member-steps per second")
    if args.json:
        record = {"phase": "population", "config": args.config, "set": args.set, "members": n,
                  "params_per_member": n_params, "device_kind": jax.devices()[0].device_kind,
                  "batch": [base.train.batch_size, base.model.seq_len],
                  "compile_s": {"population": pop_compile, "solo": solo_compile},
                  "member_steps_per_s": rates, "population_over": ratios}
        with open(args.json, "a") as f:
            f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
