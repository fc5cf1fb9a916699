"""The fused kernels against their jnp references (CPU: Pallas in interpret mode).

Ground truth is the jnp reference in kernels/src/reference.py evaluated in float32 (for bfloat16
inputs: on the same bfloat16 values, upcast), and `jax.vjp` of that reference for gradients; the
reference's own gradients are in turn checked against finite differences.
"""
from __future__ import annotations

import functools
import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from andrea_jax import kernels
from andrea_jax.kernels import reference
from _jaxpr import all_eqns

DS = (64, 768, 1000, 3072)
ROWS = (1, 7, 1030)
# Row counts are not multiples of any row block: the masked tails are exercised. Every (D, rows)
# pair is covered; alpha cycles over {0, 0.37, 1} across them (and all three at one shape below).
SHAPES = list(itertools.product(DS, ROWS))
ALPHAS = (0.0, 0.37, 1.0)
DTYPES = (jnp.float32, jnp.bfloat16)
# A covering design instead of the full product (interpret-mode compiles dominate test time):
# the dtype alternates along SHAPES, and as each D has 3 (odd) row counts, every D and every
# row count meets both dtypes.
CASES = [(D, rows, DTYPES[i % 2]) for i, (D, rows) in enumerate(SHAPES)]
CASE_IDS = [f"D{D}-rows{rows}-{jnp.dtype(dt).name}" for D, rows, dt in CASES]

# Tolerances, relative to the largest magnitude of the compared array (|a - b| <= tol * max|b|).
# float32: both sides round differently (blocked vs XLA summation order, 1/sqrt vs rsqrt). Measured
# worst case over every case below: 1.9e-7 for values and elementwise gradients, 2.4e-6 for the
# row reductions (dgamma, dbeta, dalpha, dbias over 1030 rows). 2e-5 keeps an 8x margin; a wrong
# or missing term is an O(1) relative error.
# bfloat16: the kernel rounds its float32 result once; half an ulp is at most 2^-8 = 3.9e-3 of
# the largest magnitude (measured worst 3.4e-3). 1e-2 is 2.5x that bound.
TOL = {jnp.float32: 2e-5, jnp.bfloat16: 1e-2}


def _rng(seed):
    return np.random.default_rng(seed)


def _arr(rng, shape, dtype, scale=1.0):
    return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32).astype(dtype)


def assert_close(actual, expected, tol, what):
    actual = np.asarray(jnp.asarray(actual, jnp.float32))
    expected = np.asarray(jnp.asarray(expected, jnp.float32))
    assert actual.shape == expected.shape, what
    assert np.all(np.isfinite(actual)), f"{what}: non-finite values"
    scale = max(float(np.max(np.abs(expected))), 1e-30)
    err = float(np.max(np.abs(actual - expected))) / scale
    assert err <= tol, f"{what}: max error {err:.3g} x max|ref| exceeds {tol:g}"


def _up(tree):
    return jax.tree.map(lambda a: a.astype(jnp.float32), tree)


def _residual_ref(dtype):
    """reference.residual_layer_norm for inputs upcast from `dtype`: the stream h is rounded to
    `dtype` as the reference (and the kernel) store it, with a straight-through gradient, and
    everything else runs in float32. Plain upcasting would normalise an unrounded h, a different
    function whose dalpha (one sum over all elements, with cancellation) differs by far more
    than float32 rounding."""
    def ref(x, delta, alpha, gamma, beta):
        h32 = x + alpha * delta
        h = h32 + jax.lax.stop_gradient(h32.astype(dtype).astype(jnp.float32) - h32)
        return h, reference.layer_norm(h, gamma, beta)
    return ref


def _value_and_vjp(op):
    """One jitted function: the op's outputs and its VJP at the given cotangent."""
    def run(primals, cotangent):
        out, vjp = jax.vjp(op, *primals)
        return out, vjp(cotangent)
    return jax.jit(run)


def _check_vjp(op_kernel, op_ref, primals, cotangent, dtype, what):
    """Kernel values and VJP against the float32 reference's on the same (upcast) values."""
    out, grads = _value_and_vjp(op_kernel)(primals, cotangent)
    ref_out, ref_grads = _value_and_vjp(op_ref)(_up(primals), _up(cotangent))
    for o in jax.tree.leaves(out):
        assert o.dtype == dtype, f"{what}: output dtype {o.dtype}, expected {dtype}"
    jax.tree.map(lambda a, b: assert_close(a, b, TOL[dtype], f"{what} value"), out, ref_out)
    for i, (g, r, p) in enumerate(zip(grads, ref_grads, primals)):
        assert g.dtype == p.dtype, f"{what}: cotangent {i} dtype {g.dtype} != primal {p.dtype}"
        assert_close(g, r, TOL[dtype], f"{what} grad of input {i}")


@pytest.mark.parametrize("D,rows,dtype", CASES, ids=CASE_IDS)
def test_residual_layer_norm_matches_reference(D, rows, dtype):
    rng = _rng(D * 10_000 + rows)
    alpha = jnp.float32(ALPHAS[SHAPES.index((D, rows)) % 3])
    x, delta = _arr(rng, (rows, D), dtype), _arr(rng, (rows, D), dtype)
    gamma, beta = _arr(rng, (D,), jnp.float32) + 1.0, _arr(rng, (D,), jnp.float32)
    cot = (_arr(rng, (rows, D), dtype), _arr(rng, (rows, D), dtype))
    kernel = lambda x, d, a, g, b: kernels.residual_layer_norm(x, d, a, g, b, impl="pallas")
    _check_vjp(kernel, _residual_ref(dtype), (x, delta, alpha, gamma, beta), cot, dtype,
               f"residual_layer_norm D={D} rows={rows} alpha={float(alpha)}")


@pytest.mark.parametrize("alpha", ALPHAS)
def test_residual_layer_norm_every_alpha_with_leading_shape(alpha):
    rng = _rng(7)
    x, delta = _arr(rng, (3, 5, 768), jnp.float32), _arr(rng, (3, 5, 768), jnp.float32)
    gamma, beta = _arr(rng, (768,), jnp.float32), _arr(rng, (768,), jnp.float32)
    cot = (_arr(rng, x.shape, jnp.float32), _arr(rng, x.shape, jnp.float32))
    kernel = lambda *a: kernels.residual_layer_norm(*a, impl="pallas")
    _check_vjp(kernel, reference.residual_layer_norm, (x, delta, jnp.float32(alpha), gamma, beta),
               cot, jnp.float32, f"residual_layer_norm alpha={alpha}")
    if alpha == 0.0:  # the stream passes through unchanged, bit for bit
        h, _ = kernels.residual_layer_norm(x, delta, alpha, gamma, beta, impl="pallas")
        np.testing.assert_array_equal(np.asarray(h), np.asarray(x))


# A constant alpha (the ProRes schedule, not trained): alpha is a traced jit argument but not
# differentiated, as in the model; the backward then takes the path without dalpha.
CONST_ALPHA_CASES = [(768, 1030, jnp.float32, 0.37), (1000, 7, jnp.bfloat16, 1.0), (64, 1, jnp.float32, 0.0)]


@pytest.mark.parametrize("D,rows,dtype,alpha", CONST_ALPHA_CASES,
                         ids=[f"D{D}-rows{r}-{jnp.dtype(dt).name}-a{a}" for D, r, dt, a in CONST_ALPHA_CASES])
def test_residual_layer_norm_constant_alpha_matches_reference(D, rows, dtype, alpha):
    rng = _rng(D * 10_000 + rows + 5)
    x, delta = _arr(rng, (rows, D), dtype), _arr(rng, (rows, D), dtype)
    gamma, beta = _arr(rng, (D,), jnp.float32) + 1.0, _arr(rng, (D,), jnp.float32)
    cot = (_arr(rng, (rows, D), dtype), _arr(rng, (rows, D), dtype))
    ref = _residual_ref(dtype)

    @functools.partial(jax.jit, static_argnums=3)
    def run(primals, a, cotangent, impl):
        op = (lambda x, d, g, b: kernels.residual_layer_norm(x, d, a, g, b, impl="pallas")) if impl \
            else (lambda x, d, g, b: ref(x, d, a, g, b))
        out, vjp = jax.vjp(op, *primals)
        # Only y used: the cotangent of h reaches the backward as a symbolic zero.
        y_only = jax.grad(lambda *p: jnp.sum(op(*p)[1].astype(jnp.float32) * cotangent[1]),
                          argnums=(0, 1, 2, 3))(*primals)
        return out, vjp(cotangent), y_only

    primals = (x, delta, gamma, beta)
    out, grads, y_only = run(primals, jnp.float32(alpha), cot, True)
    r_out, r_grads, r_y_only = run(_up(primals), jnp.float32(alpha), _up(cot), False)
    what = f"residual_layer_norm constant alpha={alpha} D={D} rows={rows}"
    jax.tree.map(lambda a, b: assert_close(a, b, TOL[dtype], f"{what} value"), out, r_out)
    for i, (g, r, p) in enumerate(zip(grads + y_only, r_grads + r_y_only, primals + primals)):
        assert g.dtype == p.dtype, f"{what}: cotangent {i} dtype {g.dtype} != primal {p.dtype}"
        assert_close(g, r, TOL[dtype], f"{what} grad {i}")


def _saved_residuals(f, *args) -> str:
    import contextlib
    import io

    import jax.ad_checkpoint
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        jax.ad_checkpoint.print_saved_residuals(f, *args)
    return buf.getvalue()


def test_dalpha_is_absent_from_the_backward_when_alpha_is_constant():
    """Constant alpha: the backward kernel has no dalpha output and no delta input, and delta is
    not saved for the backward; a trained alpha gets both back. Observed on the jaxpr of the
    gradient (the backward pallas_call's operand and result counts) and on the residuals that
    autodiff saves (jax.ad_checkpoint.print_saved_residuals names a saved argument by name)."""
    rng = _rng(21)
    x, delta = _arr(rng, (7, 64), jnp.float32), _arr(rng, (7, 64), jnp.float32)
    gamma, beta = _arr(rng, (64,), jnp.float32), _arr(rng, (64,), jnp.float32)

    def loss(x, delta, gamma, beta, alpha):
        h, y = kernels.residual_layer_norm(x, delta, alpha, gamma, beta, impl="pallas")
        return jnp.sum(h * h) + jnp.sum(y * y)

    def bwd_kernels(argnums):
        jaxpr = jax.make_jaxpr(jax.grad(loss, argnums))(x, delta, gamma, beta, jnp.float32(0.37))
        return [(len(e.invars), len(e.outvars)) for e in all_eqns(jaxpr.jaxpr)
                if e.primitive.name == "pallas_call" and "residual_layer_norm_bwd" in str(e.params)]

    # (h, dy, gamma, mean, rstd, dh, alpha) -> (dx, ddelta, dgamma, dbeta): no delta, no dalpha.
    assert bwd_kernels((0, 1, 2, 3)) == [(7, 4)]
    # Trained alpha: delta is read and dalpha's partial sums come out.
    assert bwd_kernels((0, 1, 2, 3, 4)) == [(8, 5)]

    const = _saved_residuals(lambda x, delta, gamma, beta: loss(x, delta, gamma, beta, jnp.float32(0.37)),
                             x, delta, gamma, beta)
    trained = _saved_residuals(loss, x, delta, gamma, beta, jnp.float32(0.37))
    assert "from the argument delta" not in const, const
    assert "from the argument delta" in trained, trained
    # The value of beta is never needed by a LayerNorm backward (only its dtype).
    saved = _saved_residuals(lambda x, gamma, beta: jnp.sum(kernels.layer_norm(x, gamma, beta, impl="pallas") ** 2),
                             x, gamma, beta)
    assert "from the argument gamma" in saved and "from the argument beta" not in saved, saved
    assert "from the argument beta" not in const and "from the argument beta" not in trained


def test_a_bfloat16_stream_is_normalised_as_it_is_stored():
    """h = x + alpha delta is rounded to the stream's bfloat16 before its LayerNorm, as the reference
    stores it and the next block reads it. y in float32 shows the rounding, which y's own rounding
    to bfloat16 would hide."""
    rng = _rng(5)
    x, delta = _arr(rng, (40, 200), jnp.bfloat16), _arr(rng, (40, 200), jnp.bfloat16)
    gamma, beta = _arr(rng, (200,), jnp.float32) + 1.0, _arr(rng, (200,), jnp.float32)
    alpha = jnp.float32(0.37)
    h, y = kernels.residual_layer_norm(x, delta, alpha, gamma, beta, impl="pallas", y_dtype=jnp.float32)
    h_ref, y_ref = reference.residual_layer_norm(x, delta, alpha, gamma, beta, y_dtype=jnp.float32)
    assert (h.dtype, y.dtype) == (jnp.bfloat16, jnp.float32)
    assert_close(h, h_ref, TOL[jnp.bfloat16], "h")
    # measured 1.2e-7, natively and with XLA_FLAGS=--xla_cpu_max_isa=AVX2; the unrounded stream's y: 2.2e-3
    assert_close(y, y_ref, TOL[jnp.float32], "y")
    unrounded = reference.layer_norm(_up(x) + alpha * _up(delta), gamma, beta)
    with pytest.raises(AssertionError, match="exceeds"):   # the two are told apart at this tolerance
        assert_close(unrounded, y_ref, TOL[jnp.float32], "y of the unrounded stream")


@pytest.mark.parametrize("D,rows,dtype", CASES, ids=CASE_IDS)
def test_layer_norm_matches_reference(D, rows, dtype):
    rng = _rng(D * 10_000 + rows + 1)
    x = _arr(rng, (rows, D), dtype)
    gamma, beta = _arr(rng, (D,), jnp.float32) + 1.0, _arr(rng, (D,), jnp.float32)
    kernel = lambda x, g, b: kernels.layer_norm(x, g, b, impl="pallas")
    _check_vjp(kernel, reference.layer_norm, (x, gamma, beta), _arr(rng, (rows, D), dtype), dtype,
               f"layer_norm D={D} rows={rows}")


@pytest.mark.parametrize("residual", [False, True], ids=["layer_norm", "residual_layer_norm"])
@pytest.mark.parametrize("D,rows", [(768, 1030), (1000, 7)])
def test_float32_stream_normalised_straight_to_bfloat16(D, rows, residual):
    """The step's case: a float32 stream (and float32 h), the normalised y written in bfloat16 for
    the next matmul by the kernel itself (y_dtype). Values and every gradient against the float32
    reference whose y is rounded to bfloat16 once; y's cotangent arrives in bfloat16."""
    rng = _rng(D + rows + residual)
    x, delta = _arr(rng, (rows, D), jnp.float32), _arr(rng, (rows, D), jnp.bfloat16)
    gamma, beta = _arr(rng, (D,), jnp.float32) + 1.0, _arr(rng, (D,), jnp.float32)
    dy = _arr(rng, (rows, D), jnp.bfloat16)
    if residual:
        primals, cot = (x, delta, jnp.float32(0.37), gamma, beta), (_arr(rng, (rows, D), jnp.float32), dy)
        op = lambda impl: lambda *a: kernels.residual_layer_norm(*a, impl=impl, y_dtype=jnp.bfloat16)
        ref = lambda x, d, a, g, b: (lambda h, y: (h, y.astype(jnp.bfloat16)))(*reference.residual_layer_norm(
            x, d.astype(jnp.float32), a, g, b))
    else:
        primals, cot = (x, gamma, beta), dy
        op = lambda impl: lambda *a: kernels.layer_norm(*a, impl=impl, y_dtype=jnp.bfloat16)
        ref = lambda x, g, b: reference.layer_norm(x, g, b).astype(jnp.bfloat16)
    for impl in ("pallas", "xla"):
        out, grads = _value_and_vjp(op(impl))(primals, cot)
        ref_out, ref_grads = _value_and_vjp(ref)(primals, cot)
        outs, ref_outs = (out, ref_out) if residual else ((out,), (ref_out,))
        assert outs[-1].dtype == jnp.bfloat16 and (not residual or outs[0].dtype == jnp.float32), impl
        # y: both round a float32 value to bfloat16 once. Measured: xla bit-equal; pallas at most
        # 1.1e-3 of max|y| (38 of 791k elements one bf16 ulp apart, where float32 statistics summed
        # in another order land across a rounding boundary). One ulp at the largest magnitude,
        # 2^-8, is the bound. h and the gradients are float32 math.
        assert_close(outs[-1], ref_outs[-1], 2 ** -8, f"{impl} y")
        if residual:
            assert_close(outs[0], ref_outs[0], TOL[jnp.float32], f"{impl} h")
        for i, (g, r, p) in enumerate(zip(grads, ref_grads, primals)):
            assert g.dtype == p.dtype, f"{impl}: cotangent {i} dtype {g.dtype} != primal {p.dtype}"
            assert_close(g, r, TOL[jnp.float32] if p.dtype == jnp.float32 else TOL[jnp.bfloat16],
                         f"{impl} grad of input {i}")


@pytest.mark.parametrize("D,rows,dtype", CASES, ids=CASE_IDS)
def test_bias_gelu_matches_reference(D, rows, dtype):
    rng = _rng(D * 10_000 + rows + 2)
    h, bias = _arr(rng, (rows, D), dtype, scale=2.0), _arr(rng, (D,), jnp.float32)
    kernel = lambda h, b: kernels.bias_gelu(h, b, impl="pallas")
    _check_vjp(kernel, reference.bias_gelu, (h, bias), _arr(rng, (rows, D), dtype), dtype,
               f"bias_gelu D={D} rows={rows}")


def test_bias_gelu_bf16_bias_and_leading_shape():
    rng = _rng(3)
    h, bias = _arr(rng, (2, 3, 1000), jnp.bfloat16), _arr(rng, (1000,), jnp.bfloat16)
    kernel = lambda h, b: kernels.bias_gelu(h, b, impl="pallas")
    _check_vjp(kernel, reference.bias_gelu, (h, bias), _arr(rng, h.shape, jnp.bfloat16),
               jnp.bfloat16, "bias_gelu bf16 bias")


# ----------------------------------------------------------------------------- finite differences

def test_reference_gradients_match_finite_differences():
    rng = _rng(11)
    x, delta = _arr(rng, (3, 16), jnp.float32), _arr(rng, (3, 16), jnp.float32)
    gamma, beta = _arr(rng, (16,), jnp.float32), _arr(rng, (16,), jnp.float32)
    # float32 finite differences: eps 1e-2 balances truncation against rounding error.
    fd = dict(order=1, modes=("rev",), eps=1e-2, atol=2e-2, rtol=2e-2)
    check_grads(lambda *a: reference.residual_layer_norm(*a), (x, delta, jnp.float32(0.37), gamma, beta), **fd)
    check_grads(lambda *a: reference.layer_norm(*a), (x, gamma, beta), **fd)
    check_grads(lambda *a: reference.bias_gelu(*a), (x, gamma), **fd)


def test_kernel_gradients_match_finite_differences():
    rng = _rng(12)
    x, delta = _arr(rng, (5, 24), jnp.float32), _arr(rng, (5, 24), jnp.float32)
    gamma, beta = _arr(rng, (24,), jnp.float32), _arr(rng, (24,), jnp.float32)
    fd = dict(order=1, modes=("rev",), eps=1e-2, atol=2e-2, rtol=2e-2)
    # jitted: the finite differences then reuse one compiled interpret-mode kernel.
    check_grads(jax.jit(lambda *a: kernels.residual_layer_norm(*a, impl="pallas")),
                (x, delta, jnp.float32(0.37), gamma, beta), **fd)
    check_grads(jax.jit(lambda *a: kernels.layer_norm(*a, impl="pallas")), (x, gamma, beta), **fd)
    check_grads(jax.jit(lambda *a: kernels.bias_gelu(*a, impl="pallas")), (x, gamma), **fd)


# ----------------------------------------------------------------------------- extreme inputs

# A constant row's output is beta exactly when its mean is exact: -O0 computes h - sum x (1/768) in one fused
# multiply-add, which leaves 3 x 2^-25 of a row of 3.0, and 1/sqrt(eps) makes that 3e-5 of the output.
@pytest.mark.compiled_at_o1
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_zero_variance_and_huge_inputs_stay_finite(dtype):
    rng = _rng(13)
    D = 768
    x = _arr(rng, (6, D), dtype, scale=1e4)
    x = x.at[0].set(3.0).at[1].set(0.0)          # rows of zero variance
    delta = _arr(rng, (6, D), dtype, scale=1e4).at[0].set(0.0).at[1].set(0.0)
    gamma, beta = _arr(rng, (D,), jnp.float32), _arr(rng, (D,), jnp.float32)
    cot = (_arr(rng, x.shape, dtype), _arr(rng, x.shape, dtype))

    kernel = lambda *a: kernels.residual_layer_norm(*a, impl="pallas")
    _check_vjp(kernel, _residual_ref(dtype), (x, delta, jnp.float32(0.37), gamma, beta),
               cot, dtype, "residual_layer_norm extreme")
    _, y = kernel(x, delta, jnp.float32(0.37), gamma, beta)
    # A constant row normalises to 0, so its output is beta.
    assert_close(y[:2], jnp.broadcast_to(beta, (2, D)), TOL[dtype], "zero-variance rows")
    _check_vjp(lambda *a: kernels.layer_norm(*a, impl="pallas"), reference.layer_norm,
               (x, gamma, beta), cot[1], dtype, "layer_norm extreme")
    _check_vjp(lambda *a: kernels.bias_gelu(*a, impl="pallas"), reference.bias_gelu,
               (x, gamma), cot[1], dtype, "bias_gelu extreme")


# ----------------------------------------------------------------------------- dispatch

def test_auto_is_xla_everywhere_and_unknown_impl_is_named():
    # 'auto' stays XLA on every backend, GPU included, until a GPU measurement of the whole train
    # step shows a kernel backend faster (docs/BENCHMARKS.md).
    assert kernels.resolve("auto") == "xla"
    with pytest.raises(ValueError, match="unknown kernel impl 'cuda'"):
        kernels.layer_norm(jnp.ones((2, 4)), jnp.ones(4), jnp.zeros(4), impl="cuda")


def test_mismatched_parameter_shape_is_a_clear_error():
    with pytest.raises(ValueError, match=r"does not match the feature dimension"):
        kernels.layer_norm(jnp.ones((2, 8)), jnp.ones(4), jnp.zeros(4), impl="pallas")


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="on GPU impl='triton' is available")
def test_triton_on_cpu_names_what_is_missing():
    with pytest.raises(kernels.KernelUnavailableError, match="triton"):
        kernels.bias_gelu(jnp.ones((2, 4)), jnp.zeros(4), impl="triton")


def _triton_ready() -> str | None:
    if jax.default_backend() != "gpu":
        return f"jax-triton kernels need a CUDA GPU; this JAX backend is {jax.default_backend()!r}"
    try:
        import andrea_jax.kernels.triton_ops  # noqa: F401
    except kernels.KernelUnavailableError as err:
        return str(err)
    return None


@pytest.mark.skipif(_triton_ready() is not None, reason=str(_triton_ready()))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("D,rows", [(768, 1030), (1000, 7), (3072, 1030)])
def test_triton_matches_reference(D, rows, dtype):
    rng = _rng(D + rows)
    x, delta = _arr(rng, (rows, D), dtype), _arr(rng, (rows, D), dtype)
    gamma, beta = _arr(rng, (D,), jnp.float32), _arr(rng, (D,), jnp.float32)
    cot = (_arr(rng, x.shape, dtype), _arr(rng, x.shape, dtype))
    _check_vjp(lambda *a: kernels.residual_layer_norm(*a, impl="triton"), _residual_ref(dtype),
               (x, delta, jnp.float32(0.37), gamma, beta), cot, dtype, "triton residual_layer_norm")
    _check_vjp(lambda *a: kernels.layer_norm(*a, impl="triton"), reference.layer_norm,
               (x, gamma, beta), cot[0], dtype, "triton layer_norm")
    _check_vjp(lambda *a: kernels.bias_gelu(*a, impl="triton"), reference.bias_gelu,
               (x, gamma), cot[0], dtype, "triton bias_gelu")


# ----------------------------------------------------------------------------- in the model

def test_pallas_model_equals_xla_model_on_tiny_config():
    """The tiny config's widths (D=128, 4 blocks, vocab 8449) on a short batch, both backends."""
    from andrea_jax import model as model_lib
    from andrea_jax.train import steps
    from andrea_jax.configs import tiny

    cfg = tiny.get_config().model
    params = model_lib.init(cfg, jax.random.key(0), "xla")["params"]
    tokens_BT1 = jax.random.randint(jax.random.key(1), (2, 33), 0, cfg.vocab_size)
    alphas_L = jnp.linspace(1.0, 0.0, cfg.n_layer)  # a fully-on block, partial ones, and alpha = 0

    def run(impl):
        model = model_lib.Andrea(cfg, impl)
        logits = jax.jit(lambda p: model.apply({"params": p}, tokens_BT1[:, :-1], alphas_L).logits)(params)
        loss, grads = jax.jit(jax.value_and_grad(lambda p: steps.loss_fn(p, model, tokens_BT1, alphas_L)))(params)
        return logits, loss, grads

    # Full float32 matmuls: on a GPU, TF32 rounding would amplify the kernels' last-bit
    # differences (no effect on CPU).
    with jax.default_matmul_precision("float32"):
        logits_x, loss_x, grads_x = run("xla")
        logits_p, loss_p, grads_p = run("pallas")
    # float32 end to end: the kernels differ from XLA's fusion only in summation order and
    # 1/sqrt vs rsqrt, measured at <= 1e-6 of each leaf's largest magnitude after 4 blocks and the
    # tied 8449-way projection; 1e-5 leaves a 10x margin and is far below any real error.
    assert_close(logits_p, logits_x, 1e-5, "logits")
    assert abs(float(loss_p) - float(loss_x)) <= 1e-5 * abs(float(loss_x))
    flat_x = jax.tree_util.tree_flatten_with_path(grads_x)[0]
    assert len(flat_x) == len(jax.tree.leaves(grads_p))
    for (path, g_x), g_p in zip(flat_x, jax.tree.leaves(grads_p)):
        assert_close(g_p, g_x, 1e-5, f"grad {jax.tree_util.keystr(path)}")


# ----------------------------------------------------------------------------- GPU lowering

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_pallas_kernels_lower_to_triton_for_cuda(dtype, monkeypatch):
    """Without a GPU, the Pallas kernels still go through the real Pallas->Triton lowering when
    exported for CUDA: Triton's constraints (power-of-two tensor shapes, supported primitives,
    pointer arithmetic of the masked loads and stores) are checked here, not only on the H200."""
    from andrea_jax.kernels import pallas_ops
    monkeypatch.setattr(pallas_ops, "INTERPRET", False)
    triton_call = "__gpu$xla.gpu.triton"
    S = lambda *shape: jax.ShapeDtypeStruct(shape, dtype)
    F = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    cases = {
        "residual_layer_norm": (lambda *a: kernels.residual_layer_norm(*a, impl="pallas"),
                                (S(2, 4096, 768), S(2, 4096, 768), F(), F(768), F(768))),
        "layer_norm": (lambda *a: kernels.layer_norm(*a, impl="pallas"), (S(7, 1000), F(1000), F(1000))),
        "bias_gelu": (lambda *a: kernels.bias_gelu(*a, impl="pallas"), (S(1030, 3072), F(3072))),
    }
    # jax >= 0.11 asks which GPU to lower for when none is attached: the H200 of the benchmark.
    h200 = jax.sharding.AbstractMesh((1,), ("gpu",), abstract_device=jax.sharding.AbstractDevice(
        device_kind="NVIDIA H200", num_cores=None, platform="gpu"))
    for name, (op, args) in cases.items():
        def fwd_bwd(*primals):
            out, vjp = jax.vjp(op, *primals)
            return vjp(out)
        with jax.sharding.use_abstract_mesh(h200):
            exported = jax.export.export(
                jax.jit(fwd_bwd), platforms=["cuda"],
                disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(triton_call)])(*args)
        assert exported.mlir_module().count(triton_call) == 2, \
            f"{name}: expected one forward and one backward Triton kernel"


def test_a_pallas_call_past_int32_offsets_is_refused_with_one_line():
    """rows x D >= 2^31 would overflow the kernels' int32 offsets: refused at trace time, naming
    the way out (checked on abstract arrays: nothing is allocated). One element fewer traces."""
    from andrea_jax.errors import KernelUnavailableError

    D = 1024
    big = jax.ShapeDtypeStruct((2**31 // D, D), jnp.bfloat16)
    fits = jax.ShapeDtypeStruct((2**31 // D - 1, D), jnp.bfloat16)
    vec = jax.ShapeDtypeStruct((D,), jnp.float32)
    for op in (lambda x, g, b: kernels.layer_norm(x, g, b, impl="pallas"),
               lambda x, g, b: kernels.bias_gelu(x, b, impl="pallas"),
               lambda x, g, b: kernels.residual_layer_norm(x, x, 0.5, g, b, impl="pallas")):
        with pytest.raises(KernelUnavailableError, match=r"2097152 rows x 1024 = 2147483648 elements.*int32"):
            jax.eval_shape(op, big, vec, vec)
        jax.eval_shape(op, fits, vec, vec)


_TRITON_PTX_MAIN = """
import jax, jax.numpy as jnp
from andrea_jax import kernels
from andrea_jax.kernels import platform
platform.TARGET_BACKEND, platform.TARGET_COMPUTE_CAPABILITY = "gpu", 90
S = lambda *s: jax.ShapeDtypeStruct(s, jnp.bfloat16)
F = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
cases = [
    (lambda x, g, b: kernels.layer_norm(x, g, b, impl="triton", y_dtype=jnp.bfloat16), (F(64, 768), F(768), F(768))),
    (lambda x, d, g, b: kernels.residual_layer_norm(x, d, 0.5, g, b, impl="triton"),
     (S(64, 768), S(64, 768), F(768), F(768))),
    (lambda x, d, a, g, b: kernels.residual_layer_norm(x, d, a, g, b, impl="triton"),
     (F(64, 768), F(64, 768), F(), F(768), F(768))),
    (lambda h, b: kernels.bias_gelu(h, b, impl="triton"), (S(64, 3072), F(3072))),
]
h200 = jax.sharding.AbstractMesh((1,), ("gpu",), abstract_device=jax.sharding.AbstractDevice(
    device_kind="NVIDIA H200", num_cores=None, platform="gpu"))
for op, args in cases:
    def fwd_bwd(*primals, op=op):
        out, vjp = jax.vjp(op, *primals)
        return vjp(out)
    with jax.sharding.use_abstract_mesh(h200):
        jax.export.export(jax.jit(fwd_bwd), platforms=["cuda"], disabled_checks=[
            jax.export.DisabledSafetyCheck.custom_call("triton_kernel_call")])(*args)
"""


def test_jax_triton_kernels_ptx_assembles_with_the_cuda12_ptxas(tmp_path):
    """jax-triton hands triton's PTX to the CUDA 12 ptxas of jax[cuda12]. Triton 3.9 would write PTX
    9.4 for sm_90, which that ptxas rejects ("Unsupported .version 9.4; current version is '8.8'",
    the first launch on the GPU); triton_ops.pin_ptxas points triton at the CUDA 12 ptxas. Every
    kernel (forward and backward of all three ops, dalpha included) is lowered for sm_90 without a
    GPU, and each PTX it wrote is assembled by that ptxas for sm_90a."""
    pytest.importorskip("jax_triton", reason="jax-triton is in the test extra")
    nvcc = pytest.importorskip("nvidia.cuda_nvcc", reason="the gpu-compile extra's ptxas")
    import pathlib
    import subprocess
    import sys

    ptxas = pathlib.Path(list(nvcc.__path__)[0]) / "bin" / "ptxas"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_TRITON_DUMP_DIR": str(tmp_path)}
    env.pop("TRITON_PTXAS_PATH", None), env.pop("TRITON_PTXAS_BLACKWELL_PATH", None)
    proc = subprocess.run([sys.executable, "-c", _TRITON_PTX_MAIN], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ptx_files = sorted(tmp_path.rglob("*.ptx"))
    names = {p.stem for p in ptx_files}
    assert {"_ln_fwd_kernel", "_residual_ln_fwd_kernel", "_ln_bwd_kernel", "_bias_gelu_fwd_kernel",
            "_bias_gelu_bwd_kernel"} <= names, names
    for ptx in ptx_files:
        version = next(l for l in ptx.read_text().splitlines() if l.startswith(".version"))
        built = subprocess.run([str(ptxas), "-arch=sm_90a", str(ptx), "-o", str(ptx.with_suffix(".cubin"))],
                               capture_output=True, text=True)
        assert built.returncode == 0, f"{ptx.name} ({version}): {built.stderr}"
