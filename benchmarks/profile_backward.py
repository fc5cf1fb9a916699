"""Where the CPU gradient of the model spends its time, op by op.

    python benchmarks/profile_backward.py                          # tiny, batch 16, 4 layers
    python benchmarks/profile_backward.py --set model.n_layer=8 --top 30

Compiles value_and_grad of the training loss (the model the train step uses), then
- reads the optimized HLO (`compiled.as_text()`) and files every instruction under the region it
  runs in: the layer scan's forward body, its backward body, or outside the scan (embedding,
  logits, loss);
- runs the gradient under `jax.profiler.trace` and sums the thunk events of each HLO op (the
  XLA CPU runtime records one per op execution, on whichever worker thread ran it);
- reports the memory XLA's buffer assignment gives the call (`temp_size_in_bytes`) and, per call,
  the minor page faults and the user / system CPU seconds of this process.

The last line explains the page faults: XLA's CPU client takes each call's temporary buffer from
malloc on a worker thread, and glibc serves a request that large from a fresh mmap, so every 4 KiB
page of it is faulted in and zeroed by the kernel on every call. The time goes to system CPU, and
it grows with every byte the scan saves for the backward pass.
"""
from __future__ import annotations

import argparse
import collections
import glob
import pathlib
import re
import resource
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from andrea_jax import config as config_lib, configs, model as model_lib  # noqa: E402
from andrea_jax.model import prores  # noqa: E402
from andrea_jax.train import steps  # noqa: E402

_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")  # unindented, ends in {
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\(")  # name = shape opcode(
_CALLS = re.compile(r"(?:calls|body|condition|to_apply)=%?([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def regions(hlo_text: str) -> dict[str, tuple[str, str, str]]:
    """{instruction: (region, shape, op_name)} for the ops the runtime executes (not the loops
    that hold them, whose events span their bodies' ops): region
    is `scan forward`, `scan backward` or `outside the scan` (while bodies are told apart by
    their metadata: the backward's carry `transpose(`)."""
    computation, instrs, calls, whiles, containers = None, {}, collections.defaultdict(set), {}, set()
    for line in hlo_text.splitlines():
        m = _COMPUTATION.match(line)
        if m and not line[:1].isspace():
            computation = m.group(2)
            continue
        m = _INSTRUCTION.match(line)
        if not m or computation is None:
            continue
        name, shape, opcode = m.groups()
        op_name = (_OP_NAME.search(line) or [None, ""])[1]
        instrs[name] = (computation, shape, op_name)
        if opcode in ("while", "conditional", "call"):  # containers: their event spans the ops inside
            containers.add(name)
        for callee in _CALLS.findall(line):
            calls[computation].add(callee)
        if opcode == "while":
            body = re.search(r"body=%?([\w.\-]+)", line).group(1)
            whiles[body] = "scan backward" if "transpose(" in op_name else "scan forward"

    def region_of(computation, seen=()):
        if computation in whiles:
            return whiles[computation]
        for parent, callees in calls.items():
            if computation in callees and parent not in seen:
                return region_of(parent, seen + (computation,))
        return "outside the scan"

    cache = {}
    out = {}
    for name, (computation, shape, op_name) in instrs.items():
        if name in containers:
            continue
        if computation not in cache:
            cache[computation] = region_of(computation)
        out[name] = (cache[computation], shape, op_name)
    return out


def op_times(fn, args, calls: int) -> dict[str, float]:
    """{hlo op: seconds per call}, summed over the worker threads' thunk events."""
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            for _ in range(calls):
                jax.block_until_ready(fn(*args))
        path = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)[0]
        data = jax.profiler.ProfileData.from_file(path)
    total = collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                op = dict(event.stats).get("hlo_op")
                if op is not None:
                    total[op] += event.duration_ns * 1e-9 / calls
    return dict(total)


def process_counters(fn, args, calls: int) -> dict[str, float]:
    """Median wall seconds, and per call: minor page faults, user and system CPU seconds."""
    times = []
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(calls):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_s": float(np.median(times)), "faults": (after.ru_minflt - before.ru_minflt) / calls,
            "user_s": (after.ru_utime - before.ru_utime) / calls, "sys_s": (after.ru_stime - before.ru_stime) / calls}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--batch", type=int, default=None, help="sequences (default: the config's)")
    parser.add_argument("--calls", type=int, default=10, help="calls profiled and counted (after 3 warm-up)")
    parser.add_argument("--top", type=int, default=25, help="ops listed")
    parser.add_argument("--forward", action="store_true", help="profile the loss alone, not its gradient")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args(argv)

    cfg = config_lib.validate(config_lib.override(configs.load(args.config), ["prores.schedule=none", *args.set]))
    m = cfg.model
    batch = args.batch or cfg.train.batch_size
    model = model_lib.Andrea(m, cfg.kernels.impl, padded_logits=True)
    params = model_lib.init(m, jax.random.key(0), cfg.kernels.impl)["params"]
    tokens = np.random.default_rng(0).integers(0, m.vocab_size, (batch, m.seq_len + 1), dtype=np.int32)
    alphas = prores.run_alphas(cfg, 0)
    loss = lambda p, t: steps.loss_fn(p, model, t, alphas)
    fn = jax.jit(loss if args.forward else jax.value_and_grad(loss)).lower(params, tokens).compile()
    where = regions(fn.as_text())
    for _ in range(3):
        jax.block_until_ready(fn(params, tokens))

    counters = process_counters(fn, (params, tokens), args.calls)
    per_op = op_times(fn, (params, tokens), args.calls)
    by_region = collections.Counter()
    per_op = {op: seconds for op, seconds in per_op.items() if op in where}  # loops out, ops in
    for op, seconds in per_op.items():
        by_region[where[op][0]] += seconds

    temp = fn.memory_analysis().temp_size_in_bytes
    print(f"{args.config}: {'loss' if args.forward else 'value_and_grad'}, batch {batch} x {m.seq_len}, "
          f"{m.n_layer} layers, d_model {m.d_model}, kernels {cfg.kernels.impl}, remat {m.remat}; "
          f"load average {pathlib.Path('/proc/loadavg').read_text().split()[:3]}")
    print(f"wall {counters['wall_s'] * 1e3:.1f} ms median; per call: user {counters['user_s'] * 1e3:.0f} ms, "
          f"system {counters['sys_s'] * 1e3:.0f} ms, {counters['faults']:.0f} minor page faults; "
          f"XLA temp buffer {temp / 2**20:.1f} MiB = {temp / 4096:.0f} pages of 4 KiB")
    total = sum(by_region.values())
    print(f"op time per call, summed over threads: {total * 1e3:.1f} ms")
    for region, seconds in by_region.most_common():
        per_layer = f"  ({seconds / m.n_layer * 1e3:.1f} ms per layer)" if region.startswith("scan") else ""
        print(f"  {region:18s} {seconds * 1e3:8.1f} ms{per_layer}")
    print(f"top {args.top} ops (ms per call, all layers):")
    for op, seconds in sorted(per_op.items(), key=lambda kv: -kv[1])[:args.top]:
        region, shape, op_name = where.get(op, ("?", "?", ""))
        print(f"  {seconds * 1e3:7.2f}  {region:16s} {op:32s} {shape:28s} {op_name[-70:]}")
    return {"wall_s": counters["wall_s"], "sys_s": counters["sys_s"], "faults": counters["faults"],
            "temp_bytes": temp, "regions_s": dict(by_region)}


if __name__ == "__main__":
    main()
