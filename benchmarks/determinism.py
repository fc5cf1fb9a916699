"""Are two identical runs the same bits, and is a resume the run it continues? With and without
train.deterministic's XLA flags (andrea_jax.startup.DETERMINISTIC_XLA_FLAGS), on synthetic tokens:

    python benchmarks/determinism.py --config andrea_120m --set model.n_layer=4 --batch 8 --steps 20
    python benchmarks/determinism.py --config tiny --batch 4 --steps 6 --allow-cpu     # on a CPU

Per setting (flags off, on), three runs, each in its own process (XLA reads its flags once, at
start): two straight runs of --steps steps, and a run stopped at half way whose state (parameters
and optimizer state, host copies) a fresh process loads and continues. Batch i is drawn from seed i,
so every run reads the same batches; each batch's checksum is recorded with its loss. Printed and
appended to --json, per setting:

    repeat     the two straight runs: how many of the losses and of the final parameters' elements
               differ in any bit, and the largest difference of each
    resume     the resumed run against the straight one: the batch checksums agree; the first
               resumed step's loss within 1e-6 of the straight run's, the later ones within the bf16
               envelope (relative 2^-8), and the final parameters' largest difference
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import zlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIRST_RESUMED_TOLERANCE = 1e-6
BF16_ENVELOPE = 2.0 ** -8


def train(args) -> None:
    """One run (in this process): steps [start, end) on batches drawn from their step's seed,
    from a fresh state or the one saved at --load; losses and checksums to --out, the state to --save."""
    from andrea_jax import startup
    startup.start_jax()
    import jax
    import numpy as np

    from andrea_jax import config as config_lib, configs
    from andrea_jax.train import steps

    cfg = config_lib.validate(config_lib.override(configs.load(args.config), [
        f"train.batch_size={args.batch}", *args.set]))
    mesh = steps.make_mesh(cfg)
    state = steps.create_state(cfg, jax.random.key(0), mesh)
    if args.load:
        saved = np.load(args.load)
        leaves, tree = jax.tree.flatten(state)
        state = jax.tree.unflatten(tree, [jax.device_put(saved[f"leaf{i}"], leaf.sharding)
                                          for i, leaf in enumerate(leaves)])
    step_fn = steps.make_train_step(cfg, mesh)
    B, S, V = cfg.train.batch_size, cfg.model.seq_len, cfg.model.vocab_size
    record = []
    for step in range(args.start, args.end):
        batch = np.random.default_rng(step).integers(0, V, (B, S + 1), dtype=np.int32)
        state, metrics = step_fn(state, jax.device_put(batch, steps.batch_sharding(cfg, mesh)))
        record.append({"step": step, "loss": float(metrics["loss"]), "batch_crc": zlib.crc32(batch.tobytes())})
    leaves = [np.asarray(jax.device_get(leaf)) for leaf in jax.tree.leaves(state)]
    np.savez(args.save, **{f"leaf{i}": leaf for i, leaf in enumerate(leaves)})
    pathlib.Path(args.out).write_text(json.dumps(record))


def child(args, flags: bool, tmp: pathlib.Path, name: str, start: int, end: int, load: str = "") -> tuple:
    from andrea_jax import startup
    env = dict(os.environ)
    if flags:
        env["XLA_FLAGS"] = startup.with_deterministic_flags(env.get("XLA_FLAGS", ""))
    command = [sys.executable, __file__, "--child", "--config", args.config, "--batch", str(args.batch),
               "--start", str(start), "--end", str(end), "--out", str(tmp / f"{name}.json"),
               "--save", str(tmp / f"{name}.npz"), *[a for s in args.set for a in ("--set", s)]]
    subprocess.run(command + (["--load", load] if load else []), env=env, check=True)
    return json.loads((tmp / f"{name}.json").read_text()), str(tmp / f"{name}.npz")


def params_difference(a: str, b: str) -> tuple[int, float, int]:
    """(elements differing in any bit, the largest difference, elements) over every saved leaf."""
    import numpy as np
    x, y = np.load(a), np.load(b)
    differ, largest, total = 0, 0.0, 0
    for key in x.files:
        u, v = x[key], y[key]
        if not u.size:
            continue
        bits_u, bits_v = (np.atleast_1d(a).view(np.uint8).reshape(a.size, -1) for a in (u, v))
        differ += int(np.any(bits_u != bits_v, axis=1).sum())
        if np.issubdtype(u.dtype, np.floating):
            largest = max(largest, float(np.max(np.abs(u.astype(np.float64) - v.astype(np.float64)))))
        total += u.size
    return differ, largest, total


def compare(args, flags: bool, tmp: pathlib.Path) -> dict:
    half = args.steps // 2
    straight, straight_params = child(args, flags, tmp, "straight", 0, args.steps)
    again, again_params = child(args, flags, tmp, "again", 0, args.steps)
    _, stopped = child(args, flags, tmp, "stopped", 0, half)
    resumed, resumed_params = child(args, flags, tmp, "resumed", half, args.steps, load=stopped)
    differ, largest, total = params_difference(straight_params, again_params)
    losses = [(a["loss"], b["loss"]) for a, b in zip(straight, again)]
    tail = straight[half:]
    relative = [abs(r["loss"] - s["loss"]) / abs(s["loss"]) for r, s in zip(resumed, tail)]
    resumed_differ, resumed_largest, _ = params_difference(straight_params, resumed_params)
    return {
        "deterministic_flags": flags,
        "repeat": {"losses_differing": sum(a != b for a, b in losses), "losses": len(losses),
                   "largest_loss_difference": max(abs(a - b) for a, b in losses),
                   "params_differing": differ, "params": total, "largest_param_difference": largest},
        "resume": {"batches_identical": [r["batch_crc"] for r in resumed] == [s["batch_crc"] for s in tail],
                   "first_step_difference": abs(resumed[0]["loss"] - tail[0]["loss"]),
                   "first_step_within": abs(resumed[0]["loss"] - tail[0]["loss"]) <= FIRST_RESUMED_TOLERANCE,
                   "largest_relative_difference": max(relative),
                   "within_bf16_envelope": max(relative) <= BF16_ENVELOPE,
                   "params_differing": resumed_differ, "largest_param_difference": resumed_largest},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="andrea_120m")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", help="append one JSON line per setting to this file")
    parser.add_argument("--flags", default="off,on", help="the settings to run: off, on, or both (off,on)")
    parser.add_argument("--allow-cpu", action="store_true", help="run on a CPU (a smoke test of the script)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("start", "end"):
        parser.add_argument(f"--{name}", type=int, default=0, help=argparse.SUPPRESS)
    for name in ("out", "save", "load"):
        parser.add_argument(f"--{name}", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        train(args)
        return 0
    if args.steps < 2:
        parser.error("--steps must be at least 2 (a resume at half way)")
    settings = args.flags.split(",")
    if not settings or set(settings) - {"off", "on"}:
        parser.error(f"--flags {args.flags}: a comma-separated list of off and on")
    from andrea_jax import startup
    startup.start_jax()
    import jax
    if jax.devices()[0].platform == "cpu" and not args.allow_cpu:
        parser.error("no GPU here; --allow-cpu runs it on the CPU")
    for flags in (setting == "on" for setting in settings):
        with tempfile.TemporaryDirectory() as tmp:
            result = {"config": args.config, "set": args.set, "batch": args.batch, "steps": args.steps,
                      **compare(args, flags, pathlib.Path(tmp))}
        print(json.dumps(result), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"phase": "determinism", **result}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
