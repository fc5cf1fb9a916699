"""Is the program andrea_jax.aot compiles without a GPU the one the GPU runs? Compiles a config's
train step twice, once as `andrea-aot` does (abstract inputs, for the target's devices from the
CUDA plugin's topology) and once as training does (jit on this machine's devices), and lists where
the optimized programs differ:

    python benchmarks/hlo_match.py --config andrea_120m --set train.batch_size=8     # on a GPU
    python benchmarks/hlo_match.py --config tiny --cpu                                # aot-for-CPU vs jit-on-CPU

Compared is each kernel's signature: its opcode (a fusion's kind and the multiset of the ops it
fuses, a custom call's target), its output shape and its operands' shapes, counted over the
program; names, metadata and backend configs (autotuned tilings, which a compile without a GPU
cannot time) are left out. Printed, and appended to --json: the kernels of each program, how many
signatures differ, and the first differences, each with its count in both programs.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from andrea_jax.aot import roofline  # noqa: E402  (the HLO parser; no jax at import)

TARGETS_BY_KIND = {"H200": "h200", "H100": "h100", "A100": "a100"}


def signatures(hlo_text: str) -> collections.Counter:
    """The multiset of kernel signatures of an optimized HLO module (roofline.kernels' kernels)."""
    comps, entry = roofline.computations(hlo_text)
    found: collections.Counter = collections.Counter()

    def shape(s: str) -> str:
        return re.sub(r"\{[^{}]*\}", "", s)   # layouts off: a layout is an implementation choice too

    def walk(name: str, count: int) -> None:
        shapes = {i.name: i.shape for i in comps.get(name, [])}
        for inst in comps.get(name, []):
            if inst.opcode == "while":
                walk(roofline._attr(inst.attrs, "body"), count * roofline._trip_count(inst))
                continue
            if inst.opcode == "call":
                walk(roofline._attr(inst.attrs, "to_apply"), count)
                continue
            if inst.opcode in roofline.NO_KERNEL:
                continue
            what = inst.opcode
            if inst.opcode == "fusion":
                fused = sorted(i.opcode for i in comps.get(roofline._attr(inst.attrs, "calls"), [])
                               if i.opcode not in ("parameter", "constant", "bitcast"))
                kind = re.search(r"kind=(k\w+)", inst.attrs)
                what = f"fusion {kind.group(1) if kind else ''} [{' '.join(fused)}]"
            elif inst.opcode == "custom-call":
                what = "custom-call " + re.search(r'custom_call_target="([^"]+)"', inst.attrs).group(1)
            operands = ", ".join(shape(shapes.get(o, "?")) for o in inst.operands)
            found[f"{what}: {shape(inst.shape)} <- ({operands})"] += count
    walk(entry, 1)
    return found


def differences(a: collections.Counter, b: collections.Counter) -> list[tuple[str, int, int]]:
    return sorted(((k, a[k], b[k]) for k in set(a) | set(b) if a[k] != b[k]), key=lambda d: -abs(d[1] - d[2]))


def compiled_pair(cfg, target: str | None) -> tuple[str, str]:
    """(aot's optimized HLO, jit's) of cfg's train step: aot for `target` (None: for this
    machine's CPU), jit on this machine's devices."""
    import jax
    import numpy as np

    from andrea_jax import aot
    from andrea_jax.train import steps

    if target:
        (report,) = aot.compile_steps(cfg, aot.gpu_devices(target, 1), eval_step=False, count_flops=False,
                                      compute_capability=aot.target_compute_capability(target))
    else:
        (report,) = aot.compile_steps(cfg, jax.devices("cpu")[:1], eval_step=False, count_flops=False,
                                      backend="cpu")
    mesh = steps.make_mesh(cfg, jax.devices()[:1])
    state = steps.create_state(cfg, jax.random.key(0), mesh)
    tokens = jax.device_put(np.zeros((cfg.train.batch_size, cfg.model.seq_len + 1), np.int32),
                            steps.batch_sharding(cfg, mesh))
    jitted = steps.make_train_step(cfg, mesh).lower(state, tokens).compile().as_text()
    return report.hlo, jitted


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="andrea_120m")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--cpu", action="store_true", help="aot for this CPU against jit on it (no GPU needed)")
    parser.add_argument("--show", type=int, default=10, help="differences printed")
    parser.add_argument("--json", help="append one JSON line to this file")
    args = parser.parse_args(argv)
    if args.cpu:
        os.environ["JAX_PLATFORMS"] = "cpu"
    from andrea_jax import config as config_lib, configs, startup
    startup.start_jax()
    import jax

    kind = jax.devices()[0].device_kind
    target = None if args.cpu else next((t for k, t in TARGETS_BY_KIND.items() if k in kind), None)
    if not args.cpu and target is None:
        parser.error(f"no aot target for the device {kind!r} (known: {', '.join(TARGETS_BY_KIND)}); "
                     "--cpu compares on a CPU")
    cfg = config_lib.validate(config_lib.override(configs.load(args.config), args.set))
    aot_hlo, jit_hlo = compiled_pair(cfg, target)
    a, b = signatures(aot_hlo), signatures(jit_hlo)
    diff = differences(a, b)
    result = {"phase": "hlo_match", "config": args.config, "set": args.set, "target": target or "cpu",
              "device_kind": kind, "aot_kernels": sum(a.values()), "jit_kernels": sum(b.values()),
              "signatures_differing": len(diff),
              "differences": [{"kernel": k, "aot": x, "jit": y} for k, x, y in diff[:args.show]]}
    print(f"aot for {target or 'cpu'}: {result['aot_kernels']} kernel launches; jit on {kind}: "
          f"{result['jit_kernels']}; {len(diff)} kernel signatures differ" + (":" if diff else " (the same program)"))
    for k, x, y in diff[:args.show]:
        print(f"  aot x{x}  jit x{y}  {k[:300]}")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
