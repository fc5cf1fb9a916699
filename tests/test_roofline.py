"""andrea_jax.aot.roofline: each kernel's FLOPs and bytes read from optimized HLO, against hand
counts of programs whose costs are known."""
import jax
import jax.numpy as jnp
import pytest

from andrea_jax.aot import roofline

PEAK, BANDWIDTH = roofline.DATASHEET["h200"]


def one_kernel(fn, *args) -> roofline.Kernel:
    found = roofline.kernels(jax.jit(fn).lower(*args).compile().as_text())
    assert len(found) == 1, found
    return found[0]


def test_a_matmul_and_an_elementwise_op_cost_what_the_hand_count_says():
    m, k, n = 64, 128, 256
    dot = one_kernel(lambda a, b: a @ b, jnp.ones((m, k)), jnp.ones((k, n)))
    assert (dot.flops, dot.bytes, dot.count) == (2 * m * k * n, 4 * (m * k + k * n + m * n), 1)
    scale = one_kernel(lambda x: x * 2.0, jnp.ones((1024,)))
    assert (scale.flops, scale.bytes) == (1024, 2 * 4 * 1024)
    bound = roofline.Roofline("h200", (dot, scale))
    assert bound.seconds == pytest.approx(max(2 * m * k * n / PEAK, 4 * (m * k + k * n + m * n) / BANDWIDTH)
                                          + max(1024 / PEAK, 8192 / BANDWIDTH), rel=1e-12)
    assert dot.bound_by(PEAK, BANDWIDTH) == "memory" and bound.max_mfu(2 * m * k * n) < 1


# A layer loop as XLA:GPU leaves it: 3 trips, each reading one layer's slice of a stacked [3, 8, 16]
# weight, multiplying it into the carry (one fusion), and writing the result into a stacked buffer
# in place; and cuDNN's causal flash attention with B H Tq Tk = 2 4 128 128 and D = 32.
LOOP_HLO = """
%fused_mul (param_0: f32[3,8,16], param_1: f32[8,16], param_2: s32[]) -> f32[8,16] {
  %param_0 = f32[3,8,16]{2,1,0} parameter(0)
  %param_2 = s32[] parameter(2)
  %c = s32[] constant(0)
  %ds = f32[1,8,16]{2,1,0} dynamic-slice(%param_0, %param_2, %c, %c), dynamic_slice_sizes={1,8,16}
  %w = f32[8,16]{1,0} bitcast(%ds)
  %param_1 = f32[8,16]{1,0} parameter(1)
  ROOT %m = f32[8,16]{1,0} multiply(%w, %param_1)
}

%fused_dus (param_0: f32[3,8,16], param_1: f32[8,16], param_2: s32[]) -> f32[3,8,16] {
  %param_0 = f32[3,8,16]{2,1,0} parameter(0)
  %param_1 = f32[8,16]{1,0} parameter(1)
  %u = f32[1,8,16]{2,1,0} bitcast(%param_1)
  %param_2 = s32[] parameter(2)
  %c = s32[] constant(0)
  ROOT %dus = f32[3,8,16]{2,1,0} dynamic-update-slice(%param_0, %u, %param_2, %c, %c)
}

%body (p: (s32[], f32[8,16], f32[3,8,16], f32[3,8,16])) -> (s32[], f32[8,16], f32[3,8,16], f32[3,8,16]) {
  %p = (s32[], f32[8,16]{1,0}, f32[3,8,16]{2,1,0}, f32[3,8,16]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8,16]{1,0} get-tuple-element(%p), index=1
  %w = f32[3,8,16]{2,1,0} get-tuple-element(%p), index=2
  %out = f32[3,8,16]{2,1,0} get-tuple-element(%p), index=3
  %y = f32[8,16]{1,0} fusion(%w, %x, %i), kind=kLoop, calls=%fused_mul
  %stacked = f32[3,8,16]{2,1,0} fusion(%out, %y, %i), kind=kLoop, calls=%fused_dus
  ROOT %t = (s32[], f32[8,16]{1,0}, f32[3,8,16]{2,1,0}, f32[3,8,16]{2,1,0}) tuple(%i, %y, %w, %stacked)
}

%cond (p: (s32[], f32[8,16], f32[3,8,16], f32[3,8,16])) -> pred[] {
  %p = (s32[], f32[8,16]{1,0}, f32[3,8,16]{2,1,0}, f32[3,8,16]{2,1,0}) parameter(0)
  ROOT %lt = pred[] constant(true)
}

ENTRY %main (x: f32[8,16], w: f32[3,8,16], out: f32[3,8,16], q: bf16[2,128,4,32]) -> bf16[2,4,128,32] {
  %x = f32[8,16]{1,0} parameter(0)
  %w = f32[3,8,16]{2,1,0} parameter(1)
  %out = f32[3,8,16]{2,1,0} parameter(2)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8,16]{1,0}, f32[3,8,16]{2,1,0}, f32[3,8,16]{2,1,0}) tuple(%zero, %x, %w, %out)
  %loop = (s32[], f32[8,16]{1,0}, f32[3,8,16]{2,1,0}, f32[3,8,16]{2,1,0}) while(%init), condition=%cond, body=%body, \
backend_config={"known_trip_count":{"n":"3"}}
  %q = bf16[2,128,4,32]{3,2,1,0} parameter(3)
  %fmha = (bf16[2,4,128,32]{3,1,2,0}, u8[0]{0}) custom-call(%q, %q, %q), custom_call_target="__cudnn$fmhaSoftmax", \
backend_config={"cudnn_fmha_backend_config": {"intermediate_tensor_shape": {"element_type": "BF16", \
"dimensions": ["2", "4", "128", "128"]}, "mask_type": "CAUSAL"}}
  ROOT %o = bf16[2,4,128,32]{3,1,2,0} get-tuple-element(%fmha), index=0
}
""".replace("\\\n", "")


def test_a_loop_body_counts_its_trips_slices_their_slice_and_causal_attention_half():
    found = {k.name: k for k in roofline.kernels(LOOP_HLO)}
    assert set(found) == {"y", "stacked", "fmha"}
    layer = 8 * 16 * 4
    # reads one layer of w and the carry, writes the product: 3 times
    assert (found["y"].flops, found["y"].bytes, found["y"].count) == (8 * 16, 2 * layer + layer + 4, 3)
    # the stacked buffer is written in place: only the update moves
    assert (found["stacked"].flops, found["stacked"].bytes, found["stacked"].count) == (0, layer + layer + 4, 3)
    qkv = 2 * 128 * 4 * 32
    assert found["fmha"].flops == 4 * 2 * 4 * 128 * 128 * 32 / 2
    assert found["fmha"].bytes == 3 * 2 * qkv + 2 * qkv


def test_an_unknown_target_is_refused():
    with pytest.raises(ValueError, match="no datasheet figures for target 'v100'"):
        roofline.roofline(LOOP_HLO, "v100")
