"""Member-steps per second of a population's vmapped step against solo steps, on equal work.

    python benchmarks/population.py                  # 8 members, depth:family=tiny,layers=24 at 8 x 32 tokens
    python benchmarks/population.py --members 2 --steps 2 --set model.n_layer=2      # a quick look

The same model, the same batch and the same number of member-steps on each side: `--steps`
population steps of N members (one vmapped, jitted step: andrea_jax.train.population, the members
at N learning rates) against N x `--steps` solo steps (steps.make_train_step, one compiled step
taking the N solo states in turn). Synthetic tokens, one device, 2 warm-up steps per side; every
timed step is waited for. Printed per side: the compile time, the median step, member-steps per
second; then population / solo. On a CPU the step is compute-bound and XLA already spreads one
step over the cores, so the population is expected to lose there; on an accelerator a small model
leaves the chip idle, which a population fills (docs/POPULATIONS.md).
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from andrea_jax import config as config_lib, configs  # noqa: E402
from andrea_jax.train import population, steps  # noqa: E402

DEFAULT_SETS = ("model.seq_len=32", "train.batch_size=8", "train.data_seed=0", "diagnostics.every=0")


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="depth:family=tiny,layers=24")
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="timed population steps (solo: N times as many)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help=f"override (after {' '.join(DEFAULT_SETS)})")
    args = parser.parse_args(argv)
    base = config_lib.validate(config_lib.override(configs.load(args.config), [*DEFAULT_SETS, *args.set]))
    n = args.members
    cfgs = population.member_configs(base, [[f"train.seed={i}", f"optim.lr={base.optim.lr * 1.25 ** i:.6g}"]
                                            for i in range(n)])
    mesh = steps.make_mesh(cfgs[0])
    tokens = jax.random.randint(jax.random.key(0), (base.train.batch_size, base.model.seq_len + 1), 0,
                                base.model.vocab_size)

    # One compiled solo step takes every solo state: the N states of member 0's config at the N seeds (an LR
    # changes no work, and another config's optimizer would be another pytree, so another compile).
    solo_states = [steps.create_state(cfgs[0], jax.random.key(i), mesh) for i in range(n)]
    solo_step, solo_compile = compiled(steps.make_train_step(cfgs[0], mesh), solo_states[0], tokens)
    solo_times = []
    solo_states[0], _ = timed(solo_step, solo_states[0], tokens, 2)  # the warm-up, then rounds of every state
    for _ in range(args.steps):
        for i in range(n):
            solo_states[i], (seconds,) = timed(solo_step, solo_states[i], tokens, 1)
            solo_times.append(seconds)

    pop_state = population.create_states(cfgs, mesh)
    pop_step, pop_compile = compiled(population.make_train_step(cfgs, mesh), pop_state, tokens)
    pop_state, _ = timed(pop_step, pop_state, tokens, 2)
    _, pop_times = timed(pop_step, pop_state, tokens, args.steps)

    n_params = sum(int(p.size) for p in jax.tree.leaves(solo_states[0].params))
    solo_rate = 1 / statistics.median(solo_times)
    pop_rate = n / statistics.median(pop_times)
    print(f"population benchmark: {n} members of {' '.join([args.config, *args.set])} ({n_params:,} parameters each), "
          f"batch {base.train.batch_size} x {base.model.seq_len} tokens, 1 {jax.devices()[0].platform} device",
          flush=True)
    print(f"solo:       compile {solo_compile:.1f} s, step {1e3 * statistics.median(solo_times):.1f} ms (median of "
          f"{len(solo_times)}), {solo_rate:.1f} member-steps/s")
    print(f"population: compile {pop_compile:.1f} s, step {1e3 * statistics.median(pop_times):.1f} ms (median of "
          f"{len(pop_times)} steps of {n} members), {pop_rate:.1f} member-steps/s")
    print(f"population / solo: {pop_rate / solo_rate:.2f}x member-steps per second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
