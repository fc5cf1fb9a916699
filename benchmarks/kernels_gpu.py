"""GPU proof of the fused kernels: correctness against the jnp reference, then speed against XLA.

    python benchmarks/kernels_gpu.py                 # H200: 3-5 minutes expected; prints a markdown table
    python benchmarks/kernels_gpu.py --out /tmp/k.md --json /tmp/k.jsonl
    python benchmarks/kernels_gpu.py --sweep         # also try a few Pallas tilings (longer)

For each op (residual_layer_norm and layer_norm at D=768, bias_gelu at F=3072), each dtype
(bfloat16, float32), each row count (8 x 1024 to 64 x 1024 tokens) and each mode (forward;
forward+backward), it times every backend: `xla` (XLA's own fusion of the jnp reference),
`pallas` (Triton-lowered Pallas) and `triton` (jax-triton; only where `jax_triton` imports; a
wheel carried to the machine installs with `pip install --no-deps jax_triton-*.whl`).

Reported: time per call, effective bandwidth (the minimum HBM bytes the op must move, divided by
the time), its fraction of the H200's 4.8 TB/s, and the speedup over `xla`. Targets:
residual_layer_norm forward+backward >= 1.5x XLA and >= 80% of HBM bandwidth; bias_gelu
forward+backward >= 1.2x XLA. The script reports them; it never asserts them.

Timing: each call sits in a jitted chain of `--chain` calls, each feeding its first output to the
next call's first input, with an optimization barrier between calls so that XLA cannot fuse
across them; the median over `--repeats` runs of the chain, divided by its length, is one call.
This removes host dispatch from the small shapes. Exit status 1 if any correctness check fails.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
import warnings

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from andrea_jax import kernels  # noqa: E402
from andrea_jax.kernels import pallas_ops, reference  # noqa: E402

HBM_BYTES_PER_S = 4.8e12  # H200 HBM3e peak
D_NORM, D_GELU = 768, 3072
# Arrays of [rows, D] the op must read or write at least once (statistics and [D] vectors are
# negligible): forward, and forward+backward (the backward reads its residuals and cotangents).
ARRAYS = {
    # alpha is a constant (the ProRes schedule), so the backward neither reads delta nor sums dalpha
    "residual_layer_norm": {"fwd": 4, "fwd+bwd": 9},   # x, delta -> h, y | h, dy, dh -> dx, ddelta
    "layer_norm": {"fwd": 2, "fwd+bwd": 5},            # x -> y | x, dy -> dx
    "bias_gelu": {"fwd": 2, "fwd+bwd": 5},             # h -> y | h, dy -> dh
}
TARGETS = {("residual_layer_norm", "fwd+bwd"): (1.5, 0.80), ("bias_gelu", "fwd+bwd"): (1.2, None)}
# `--dtypes mixed`: the train step's case of the norms, a float32 stream (x, h, dx, dh) with the
# normalised y, its cotangent and the attention output delta in bf16 (y_dtype). Bytes per element.
MIXED = "mixed"
MIXED_BYTES = {"residual_layer_norm": {"fwd": 4 + 2 + 4 + 2, "fwd+bwd": 12 + 4 + 2 + 4 + 4 + 2},
               "layer_norm": {"fwd": 4 + 2, "fwd+bwd": 6 + 4 + 2 + 4}}


def _dtypes(dtype):
    """(stream dtype, dtype of delta and y or None): `mixed` is float32 in, bf16 out."""
    return (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)) if dtype == MIXED else (jnp.dtype(dtype), None)


def dtype_label(dtype) -> str:
    return MIXED if dtype == MIXED else jnp.dtype(dtype).name


def available_impls() -> tuple[list[str], str]:
    impls, note = ["xla", "pallas"], ""
    try:
        from andrea_jax.kernels import triton_ops
        triton_ops.check_available()
        impls.append("triton")
    except kernels.KernelUnavailableError as err:
        note = f"triton skipped: {err}"
    return impls, note


# ----------------------------------------------------------------------------- the ops


def make_case(op: str, rows: int, dtype, seed: int = 0):
    """(primals, cotangent, fn(impl) -> callable(*primals)) for one op at one shape."""
    rng = np.random.default_rng(seed)
    arr = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)
    dtype, y_dtype = _dtypes(dtype)
    small = y_dtype or dtype
    if op == "residual_layer_norm":
        D = D_NORM
        primals = (arr(rows, D).astype(dtype), arr(rows, D).astype(small), jnp.float32(0.37),
                   arr(D) + 1.0, arr(D))
        cot = (arr(rows, D).astype(dtype), arr(rows, D).astype(small))
        fn = lambda impl: (lambda *a: reference.residual_layer_norm(*a, y_dtype=y_dtype)) if impl == "ref" else \
            (lambda *a: kernels.residual_layer_norm(*a, impl=impl, y_dtype=y_dtype))
    elif op == "layer_norm":
        D = D_NORM
        primals = (arr(rows, D).astype(dtype), arr(D) + 1.0, arr(D))
        cot = arr(rows, D).astype(small)
        fn = lambda impl: (lambda *a: reference.layer_norm(*a, y_dtype=y_dtype)) if impl == "ref" else \
            (lambda *a: kernels.layer_norm(*a, impl=impl, y_dtype=y_dtype))
    else:
        D = D_GELU
        primals = (arr(rows, D).astype(dtype), arr(D))
        cot = arr(rows, D).astype(dtype)
        fn = lambda impl: (lambda *a: reference.bias_gelu(*a)) if impl == "ref" else \
            (lambda *a: kernels.bias_gelu(*a, impl=impl))
    return primals, cot, fn, D


def fwd_bwd(f, op: str = "", *, trained_alpha: bool = False):
    """(primals, cot) -> (outputs, cotangents of the differentiated primals).

    residual_layer_norm: alpha (primals[2]) is a constant, not differentiated, as in training
    with the ProRes schedule: the kernel's backward then skips dalpha, and so must XLA's
    baseline. The cotangents returned are those of (x, delta, gamma, beta); with
    `trained_alpha` (correctness only) of all five.
    """
    def run(primals, cot):
        if op == "residual_layer_norm" and not trained_alpha:
            x, delta, alpha, gamma, beta = primals
            out, vjp = jax.vjp(lambda x, d, g, b: f(x, d, alpha, g, b), x, delta, gamma, beta)
        else:
            out, vjp = jax.vjp(f, *primals)
        return out, vjp(cot)
    return run


# ----------------------------------------------------------------------------- correctness


def rel_err(a, b) -> float:
    a, b = np.asarray(jnp.asarray(a, jnp.float32)), np.asarray(jnp.asarray(b, jnp.float32))
    if not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def check(op: str, impl: str, dtype, rows: int = 4096 + 7) -> tuple[bool, float]:
    """Values and VJP of `impl` against the float32 reference on the same values (upcast).

    Tolerances relative to the largest reference magnitude: bfloat16 1e-2 as in
    tests/test_kernels.py (2.5x the half-ulp bound of one bf16 rounding); float32 1e-4, looser
    than the CPU tests' 2e-5 because XLA:GPU may evaluate tanh and rsqrt its own way. The
    residual op's reference rounds the stream to the input dtype with a straight-through
    gradient, as the kernel stores it.
    """
    primals, cot, fn, _ = make_case(op, rows, dtype, seed=1)
    up = lambda t: jax.tree.map(lambda a: a.astype(jnp.float32), t)
    stream, y_dtype = _dtypes(dtype)
    rounded = lambda y: y if y_dtype is None else y.astype(y_dtype).astype(jnp.float32)
    if op == "residual_layer_norm":
        def ref(x, d, a, g, b):
            h32 = x + a * d
            h = h32 + jax.lax.stop_gradient(h32.astype(stream).astype(jnp.float32) - h32)
            return h, rounded(reference.layer_norm(h, g, b))
    elif op == "layer_norm":
        ref = lambda x, g, b: rounded(reference.layer_norm(x, g, b))
    else:
        ref = fn("ref")
    errs = []
    # residual_layer_norm: the timed backward (constant alpha) and the one with dalpha (trained).
    for trained in ((False, True) if op == "residual_layer_norm" else (False,)):
        out, grads = jax.jit(fwd_bwd(fn(impl), op, trained_alpha=trained))(primals, cot)
        r_out, r_grads = jax.jit(fwd_bwd(ref, op, trained_alpha=trained))(up(primals), up(cot))
        errs += [rel_err(a, b) for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(r_out))]
        errs += [rel_err(a, b) for a, b in zip(grads, r_grads)]
    tol = 1e-4 if dtype != MIXED and jnp.dtype(dtype) == jnp.float32 else 1e-2
    return max(errs) <= tol, max(errs)


# ----------------------------------------------------------------------------- timing


def chained(step, n: int):
    """n calls of step(args) -> new args, with a barrier between calls, as one jitted function."""
    def run(args):
        for _ in range(n):
            args = jax.lax.optimization_barrier(step(args))
        return args
    return jax.jit(run)


def time_call(op: str, impl: str, mode: str, rows: int, dtype, chain: int, repeats: int) -> float:
    primals, cot, fn, _ = make_case(op, rows, dtype)
    f = fn("ref" if impl == "xla" else impl)
    # Every output the kernel writes feeds the next call, so that XLA's baseline cannot drop any
    # of them (e.g. the store of h, or dgamma) while the opaque kernel computes them all.
    # [D] sums join their parameter scaled by 1e-30: a real dependency at negligible cost.
    nudge = lambda p, s: p + (s * 1e-30).astype(p.dtype)
    if mode == "fwd":
        def step(args):
            out = f(*args)
            if op == "residual_layer_norm":  # y -> next x, h -> next delta
                h, y = out
                return (y.astype(args[0].dtype), h.astype(args[1].dtype)) + tuple(args[2:])
            return (out.astype(args[0].dtype),) + tuple(args[1:])
        args = primals
    else:
        g = fwd_bwd(f, op)

        def step(args):
            primals, cot = args
            _, grads = g(primals, cot)
            if op == "residual_layer_norm":  # grads of (x, delta, gamma, beta); alpha constant
                x, delta, alpha, gamma, beta = primals
                dx, ddelta, dgamma, dbeta = grads
                new = (dx.astype(x.dtype), ddelta.astype(delta.dtype), alpha,
                       nudge(gamma, dgamma), nudge(beta, dbeta))
            elif op == "layer_norm":
                (x, gamma, beta), (dx, dgamma, dbeta) = primals, grads
                new = (dx.astype(x.dtype), nudge(gamma, dgamma), nudge(beta, dbeta))
            else:
                (h, bias), (dh, dbias) = primals, grads
                new = (dh.astype(h.dtype), nudge(bias, dbias))
            return new, cot
        args = (primals, cot)
    run = chained(step, chain)
    jax.block_until_ready(run(args))  # compile and warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(run(args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / chain


# ----------------------------------------------------------------------------- main


def append_json(path: str | None, record: dict) -> None:
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="8192,32768,65536", help="comma-separated row counts (tokens)")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--ops", default="residual_layer_norm,bias_gelu,layer_norm")
    p.add_argument("--chain", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sweep", action="store_true", help="also time a few Pallas GPU tilings")
    p.add_argument("--budget-s", type=float, default=420.0, help="start no new case after this")
    p.add_argument("--out", help="write the markdown table here too")
    p.add_argument("--json", help="append one JSON line per check and measurement here, as each is made")
    p.add_argument("--allow-cpu", action="store_true",
                   help="run anyway without a GPU (interpret mode: a smoke test of this script, not a benchmark)")
    a = p.parse_args(argv)
    start = time.perf_counter()
    warnings.simplefilter("once")

    dev = jax.devices()[0]
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, device {dev.device_kind}")
    if jax.default_backend() != "gpu" and not a.allow_cpu:
        print("no GPU: nothing to measure (the Pallas kernels run in interpret mode on CPU, which "
              "says nothing about speed); run this on the H200")
        return 2
    impls, note = available_impls()
    if note:
        print(note)
    ops = a.ops.split(",")
    dtypes = [d if d == MIXED else jnp.dtype(d) for d in a.dtypes.split(",")]
    rows_list = [int(r) for r in a.rows.split(",")]

    failed = []
    print(f"\n## correctness on {jax.default_backend()} (max error / max |reference|, values and gradients)")
    for op in ops:
        for impl in impls[1:]:
            for dtype in dtypes:
                if dtype == MIXED and op not in MIXED_BYTES:
                    continue
                try:
                    ok, err = check(op, impl, dtype, rows=min(4096, rows_list[0]) + 7)
                except Exception as exc:  # a backend that does not build here must not hide the others
                    print(f"ERROR {op:20s} {impl:7s} {dtype_label(dtype):9s} {type(exc).__name__}: {str(exc)[:300]}")
                    failed.append((op, impl, dtype_label(dtype), type(exc).__name__))
                    continue
                print(f"{'PASS' if ok else 'FAIL'} {op:20s} {impl:7s} {dtype_label(dtype):9s} {err:.2e}", flush=True)
                append_json(a.json, dict(phase="kernels_check", op=op, impl=impl, dtype=dtype_label(dtype),
                                         ok=bool(ok), rel_err=err))
                if not ok:
                    failed.append((op, impl, dtype_label(dtype), err))

    tilings = [("default", pallas_ops.GpuTiling())]
    if a.sweep:
        tilings += [("tile8k-w8", pallas_ops.GpuTiling(tile_elems=8192, norm_warps=8, gelu_rows=16, gelu_warps=8)),
                    ("bwd4k", pallas_ops.GpuTiling(bwd_tile_elems=4096)),  # the backward before its register cut
                    ("tile2k", pallas_ops.GpuTiling(tile_elems=2048, gelu_rows=4)),
                    ("stages2", pallas_ops.GpuTiling(bwd_stages=2)),
                    ("progs1056-rows64", pallas_ops.GpuTiling(target_programs=1056, min_rows_per_program=64))]

    header = ("| op | mode | dtype | rows x D | impl | time (us) | GB/s | % of 4.8 TB/s | vs xla |\n"
              "|---|---|---|---|---|---:|---:|---:|---:|")
    lines, records = [header], []
    print("\n## speed\n" + header, flush=True)
    out_of_time = False
    for op in ops:
        for mode in ("fwd+bwd", "fwd"):  # the targets' mode first, in case the budget runs out
            for dtype in dtypes:
                for rows in rows_list:
                    if time.perf_counter() - start > a.budget_s:
                        out_of_time = True
                        break
                    D = D_GELU if op == "bias_gelu" else D_NORM
                    if dtype == MIXED and op not in MIXED_BYTES:
                        continue  # bias+GELU reads and writes one dtype
                    nbytes = rows * D * (MIXED_BYTES[op][mode] if dtype == MIXED else
                                         ARRAYS[op][mode] * dtype.itemsize)
                    base = None
                    variants = [(impl, "default") for impl in impls]
                    variants += [("pallas", name) for name, _ in tilings[1:]]
                    for impl, tiling_name in variants:
                        pallas_ops.GPU_TILING = dict(tilings)[tiling_name]
                        try:
                            t = time_call(op, impl, mode, rows, dtype, a.chain, a.repeats)
                        except Exception as err:  # report and go on: one failing lowering must not hide the rest
                            print(f"| {op} | {mode} | {dtype_label(dtype)} | {rows} x {D} | {impl} | "
                                  f"error: {type(err).__name__}: {str(err)[:200]} |||||")
                            continue
                        finally:
                            pallas_ops.GPU_TILING = pallas_ops.GpuTiling()
                        base = t if impl == "xla" else base
                        gbs = nbytes / t / 1e9
                        label = impl if tiling_name == "default" else f"{impl} ({tiling_name})"
                        speedup = f"{base / t:.2f}x" if base else "-"
                        line = (f"| {op} | {mode} | {dtype_label(dtype)} | {rows} x {D} | {label} | {t * 1e6:.1f} | "
                                f"{gbs:.0f} | {100 * gbs * 1e9 / HBM_BYTES_PER_S:.0f}% | {speedup} |")
                        print(line, flush=True)
                        lines.append(line)
                        records.append(dict(phase="kernels", op=op, mode=mode, dtype=dtype_label(dtype), rows=rows, D=D,
                                            impl=label, seconds=t, bytes=nbytes, gb_per_s=gbs,
                                            speedup_vs_xla=(base / t if base else None)))
                        append_json(a.json, records[-1])  # now: a timeout later must not lose it
    if out_of_time:
        print(f"(stopped starting new cases after --budget-s {a.budget_s:.0f} s)")

    print("\n## targets, fwd+bwd at the largest row count measured")
    for (op, mode), (min_speedup, min_bw) in TARGETS.items():
        for r in [r for r in records if r["op"] == op and r["mode"] == mode and r["impl"] in ("pallas", "triton")]:
            if r["rows"] != max(x["rows"] for x in records if x["op"] == op):
                continue
            frac = r["gb_per_s"] * 1e9 / HBM_BYTES_PER_S
            ok = (r["speedup_vs_xla"] or 0) >= min_speedup and (min_bw is None or frac >= min_bw)
            want = f">= {min_speedup}x XLA" + (f", >= {min_bw:.0%} HBM" if min_bw else "")
            print(f"{'MET ' if ok else 'MISS'} {op} {mode} {r['dtype']} {r['impl']}: "
                  f"{r['speedup_vs_xla'] or 0:.2f}x, {frac:.0%} HBM (want {want})")

    if a.out:
        pathlib.Path(a.out).write_text("\n".join(lines) + "\n")
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    if failed:
        print(f"CORRECTNESS FAILURES: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
