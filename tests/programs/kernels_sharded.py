"""Sharded kernels equal unsharded ones, on 8 CPU devices, with no all-gather of the activations.

Run by tests/test_kernels_sharded.py in a subprocess (the rest of the suite sees one device):
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/programs/kernels_sharded.py
Prints one "OK <case>" line per case and exits non-zero on the first mismatch.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import re
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

from andrea_jax import kernels  # noqa: E402

# float32 throughout; the sharded run sums dgamma/dbeta/dalpha/dbias as per-device partials plus
# a psum, the unsharded one in one pass: only the summation order differs (measured <= 1e-6 of
# the largest magnitude).
TOL = 1e-5
COLLECTIVE = re.compile(r"all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter")


def collectives(hlo: str) -> set[str]:
    return set(COLLECTIVE.findall(hlo))


def assert_close(actual, expected, what):
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    scale = max(float(np.max(np.abs(expected))), 1e-30)
    err = float(np.max(np.abs(actual - expected))) / scale
    assert err <= TOL, f"{what}: sharded differs from unsharded by {err:.3g} x max|unsharded|"


def value_and_vjp(op):
    def run(primals, cotangent):
        out, vjp = jax.vjp(op, *primals)
        return out, vjp(cotangent)
    return run


def ops(D, F):
    rng = np.random.default_rng(0)
    arr = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
    return {  # name: (op, row arrays, replicated arrays, cotangent of the outputs)
        "residual_layer_norm": (lambda x, d, a, g, b: kernels.residual_layer_norm(x, d, a, g, b, impl="pallas"),
                                2, (jnp.float32(0.37), arr(D), arr(D)), 2),
        "layer_norm": (lambda x, g, b: kernels.layer_norm(x, g, b, impl="pallas"), 1, (arr(D), arr(D)), 1),
        "bias_gelu": (lambda h, b: kernels.bias_gelu(h, b, impl="pallas"), 1, (arr(F),), 1),
    }, arr


def check_ops(mesh, spec, lead, label, *, context: bool):
    D, F = 64, 256
    table, arr = ops(D, F)
    for name, (op, n_rows, replicated, n_cot) in table.items():
        width = F if name == "bias_gelu" else D
        rows = tuple(arr(*lead, width) for _ in range(n_rows))
        cot = tuple(arr(*lead, width) for _ in range(n_cot))
        cot = cot if n_cot > 1 else cot[0]
        primals = rows + replicated
        expected_out, expected_grads = jax.jit(value_and_vjp(op))(primals, cot)  # one device

        row_sharding, rep = NamedSharding(mesh, spec), NamedSharding(mesh, P())
        put = lambda a, s: jax.device_put(a, s)
        s_primals = tuple(put(a, row_sharding) for a in rows) + tuple(put(a, rep) for a in replicated)
        s_cot = jax.tree.map(lambda a: put(a, row_sharding), cot)
        fn = jax.jit(value_and_vjp(op))
        with jax.set_mesh(mesh) if context else contextlib.nullcontext():
            lowered = fn.lower(s_primals, s_cot)
            compiled = lowered.compile()  # one compile: the run and the HLO checks below read it
            out, grads = compiled(s_primals, s_cot)
            fwd_hlo = jax.jit(op).lower(*s_primals).compile().as_text()

        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(expected_out)):
            assert_close(a, b, f"{label} {name} value")
        for i, (a, b) in enumerate(zip(grads, expected_grads)):
            assert_close(a, b, f"{label} {name} grad {i}")
        for a in jax.tree.leaves(out):  # outputs stay split like the inputs
            assert a.sharding.is_equivalent_to(row_sharding, a.ndim), f"{label} {name}: {a.sharding}"

        stablehlo, hlo = lowered.as_text(), compiled.as_text()
        # The kernels ran inside a shard_map (a manual computation) ...
        assert "manual_computation" in stablehlo, f"{label} {name}: no shard_map"
        # ... so XLA gathered nothing: the forward pass has no collective at all, and the
        # backward adds only the all-reduce (psum) of the row reductions.
        assert not collectives(fwd_hlo), f"{label} {name}: forward {collectives(fwd_hlo)}"
        assert collectives(hlo) == {"all-reduce"}, f"{label} {name}: backward {collectives(hlo)}"
        print(f"OK {label} {name}", flush=True)


def check_model():
    """The tiny model, trainer-style (explicit 1-D 'data' mesh, batch split), pallas vs xla."""
    from andrea_jax import model as model_lib
    from andrea_jax.train import steps
    from andrea_jax.configs import tiny

    cfg = tiny.get_config().model
    params = model_lib.init(cfg, jax.random.key(0), "xla")["params"]
    tokens = jax.random.randint(jax.random.key(1), (8, 17), 0, cfg.vocab_size)
    alphas = jnp.linspace(1.0, 0.0, cfg.n_layer)

    def grads(impl, params, tokens):
        model = model_lib.Andrea(cfg, impl)
        return jax.value_and_grad(lambda p: steps.loss_fn(p, model, tokens, alphas))(params)

    loss_x, grads_x = jax.jit(lambda p, t: grads("xla", p, t))(params, tokens)
    # As the trainer builds it: auto axes, batch split over 'data'; the mesh made current with
    # jax.set_mesh is what tells the kernels which axes split the rows.
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    s_params = jax.device_put(params, NamedSharding(mesh, P()))
    s_tokens = jax.device_put(tokens, NamedSharding(mesh, P("data")))
    fn = jax.jit(lambda p, t: grads("pallas", p, t))
    with jax.set_mesh(mesh):
        lowered = fn.lower(s_params, s_tokens)
        compiled = lowered.compile()  # one compile: the run and the HLO checks below read it
        loss_p, grads_p = compiled(s_params, s_tokens)
    assert abs(float(loss_p) - float(loss_x)) <= TOL * abs(float(loss_x)), (loss_p, loss_x)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(grads_p)[0], jax.tree.leaves(grads_x)):
        assert_close(a, b, f"model grad {jax.tree_util.keystr(path)}")
    # 4 kernels forward, 4 backward: each inside its own shard_map.
    n_manual = lowered.as_text().count("sdy.manual_computation")
    hlo = compiled.as_text()
    print(f"model: {n_manual} manual computations, {hlo.count('all-gather')} all-gathers in the compiled HLO")
    assert n_manual >= 8, "the model's kernels did not run per shard"
    assert "all-gather" not in hlo and "all-to-all" not in hlo, \
        f"the sharded model moves activations: {collectives(hlo)}"
    print("OK model tiny pallas sharded == xla unsharded", flush=True)


def check_control():
    """Without a mesh in context an auto-sharded input reaches the kernel unwrapped: XLA then
    collects the whole input on every device (on CPU, where the interpret-mode kernel is plain
    HLO, as an all-reduce; on GPU as an all-gather) and the output comes back replicated. So the
    collective-free forward asserted above is the shard_map's doing."""
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    x = jax.device_put(jnp.ones((16, 3, 64)), NamedSharding(mesh, P("data")))
    g = jax.device_put(jnp.ones((64,)), NamedSharding(mesh, P()))
    compiled = jax.jit(lambda x, g: kernels.layer_norm(x, g, g, impl="pallas")).lower(x, g).compile()
    assert collectives(compiled.as_text()), "control: expected a collective before the unwrapped kernel"
    print(f"OK control: the unwrapped kernel needs {sorted(collectives(compiled.as_text()))}", flush=True)


def main():
    assert jax.device_count() == 8, f"need 8 devices, got {jax.device_count()} (set XLA_FLAGS first)"
    explicit = jax.make_mesh((4, 2), ("data", "seq"), axis_types=(AxisType.Explicit,) * 2)
    check_ops(explicit, P("data", "seq"), (8, 6), "explicit data x seq", context=False)
    auto = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    check_ops(auto, P("data"), (16, 3), "auto data (set_mesh)", context=True)
    check_control()
    check_model()
    print("ALL OK", flush=True)


if __name__ == "__main__":
    main()
