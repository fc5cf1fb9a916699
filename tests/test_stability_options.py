"""Three options of the optimizer and the model, off by default, against references written here:
optim.skip_spikes (a loss spike's update is not applied), optim.z_loss (PaLM's log Z penalty,
logged apart from the loss) and model.qk_norm (RMSNorm of each head's queries and keys). Resume
with spike skipping on: tests/test_resume.py (the SIGTERM test runs with it)."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from andrea_jax import model as model_lib
from andrea_jax.config import Config, ModelConfig, OptimConfig, ProResConfig, TrainConfig
from andrea_jax.model import hf, prores
from andrea_jax.train import optim, steps
from andrea_jax.workdir import changed_settings
from _helpers import cached_logits
from test_llama import jitted

W, L = 5, 3  # the spike window, blocks


def toy_params():
    return {"blocks": {"w": jnp.arange(L * 2, dtype=jnp.float32).reshape(L, 2) / 10}, "emb": jnp.ones((4,))}


def spiky_optimizer(sigmas=3.0):
    return optim.skip_loss_spikes(optax.adam(0.1), sigmas, W, L)


def grads_scaled(k):
    """Gradients whose block l has norm k * (l + 1) (block l's 2 entries are k (l + 1) / sqrt(2))."""
    g = np.repeat((k * (np.arange(L) + 1) / np.sqrt(2))[:, None], 2, axis=1).astype(np.float32)
    return {"blocks": {"w": jnp.asarray(g)}, "emb": jnp.full((4,), 0.5)}


def test_an_update_whose_loss_leaves_the_window_s_band_is_not_applied():
    tx, params = spiky_optimizer(sigmas=3.0), toy_params()
    state = tx.init(params)
    losses = [4.0, 4.2, 3.9, 4.1, 4.0]
    for step, loss in enumerate(losses):  # the window fills; a loss far above is no spike yet
        updates, state = tx.update(grads_scaled(1.0), state, params, loss=jnp.float32(loss), step=step)
        assert np.abs(np.asarray(updates["emb"])).max() > 0
    assert int(state.taken) == W and int(state.skipped) == 0
    np.testing.assert_allclose(np.asarray(state.losses_W), losses)

    mean, std = np.mean(losses), np.std(losses)  # 4.04, 0.102: the band ends at 4.35
    before = state
    spike = 4.5  # (4.5 - 4.04) / 0.102 = 4.5 standard deviations
    updates, state = tx.update(grads_scaled(4.0), state, params, loss=jnp.float32(spike), step=5)
    assert all(np.all(np.asarray(u) == 0) for u in jax.tree.leaves(updates))
    jax.tree.map(np.testing.assert_array_equal, state.inner_state, before.inner_state)  # Adam untouched
    np.testing.assert_array_equal(state.losses_W, before.losses_W)  # the spike does not enter the window
    assert (int(state.skipped), int(state.taken), int(state.last_step)) == (1, W, 5)
    # float32 on the device against float64 numpy: the std of losses near 4 spread by 0.1 loses ~40x of
    # float32's 6e-8 to cancellation (measured 9.7e-7).
    np.testing.assert_allclose([state.last_loss, state.last_mean, state.last_std], [spike, mean, std], rtol=3e-6)
    # Block norms were (l + 1) at every step of the window, now 4 (l + 1): each jumped x4.
    np.testing.assert_allclose(state.last_jump_L, [4.0] * L, rtol=1e-7)  # measured exact; 1e-7: one rounding

    # A loss inside the band is applied, as Adam's first step from the untouched state would be.
    updates, state = tx.update(grads_scaled(1.0), state, params, loss=jnp.float32(4.3), step=6)
    want, _ = optax.adam(0.1).update(grads_scaled(1.0), before.inner_state, params)
    # lax.cond compiles the branch, which XLA fuses; optax op by op rounds once more: measured 1.5e-7.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), updates, want)
    assert (int(state.skipped), int(state.taken)) == (1, W + 1)
    assert float(state.losses_W[W % W]) == pytest.approx(4.3)  # the ring's oldest slot
    assert (float(state.last_loss), int(state.last_step)) == (spike, 5)  # still the skipped update's

    # A non-finite loss is no spike (skip_nonfinite's business) and never enters the window.
    _, after_nan = tx.update(grads_scaled(1.0), state, params, loss=jnp.float32(np.nan), step=7)
    assert int(after_nan.skipped) == 1 and int(after_nan.taken) == W + 1
    np.testing.assert_array_equal(after_nan.losses_W, state.losses_W)
    _, after_inf = tx.update(grads_scaled(1.0), state, params, loss=jnp.float32(np.inf), step=8)
    assert int(after_inf.skipped) == 1 and int(after_inf.taken) == W + 1
    np.testing.assert_array_equal(after_inf.losses_W, state.losses_W)


def test_the_optimizer_asks_for_the_loss():
    tx, params = spiky_optimizer(), toy_params()
    with pytest.raises(ValueError, match="loss="):
        tx.update(grads_scaled(1.0), tx.init(params), params)


CFG = Config(model=ModelConfig(vocab_size=300, seq_len=16, d_model=32, n_layer=2, n_head=4),
             prores=ProResConfig(schedule="linear", warmup=4, scale_updates="alpha"),
             optim=OptimConfig(lr=1e-5, warmup_steps=0, skip_spikes=3.0, skip_spikes_window=4),
             train=TrainConfig(steps=20, batch_size=4))


def test_the_train_step_skips_a_spike_and_counts_it():
    """Four steps at a tiny LR on one batch (losses within ~1e-3), then the batch of highest loss
    among random candidates: nothing moves but the step count; then training goes on."""
    mesh = steps.make_mesh(CFG)
    state = steps.create_state(CFG, jax.random.key(0), mesh)
    candidates = jax.random.randint(jax.random.key(1), (8, 4, 17), 0, 300)
    model = model_lib.Andrea(CFG.model, padded_logits=True)
    loss_fn = jax.jit(steps.loss_fn, static_argnums=1)  # op by op, each operation would compile alone
    losses = [float(loss_fn(state.params, model, c, prores.run_alphas(CFG, 0))) for c in candidates]
    calm, spiky = candidates[int(np.argmin(losses))], candidates[int(np.argmax(losses))]
    assert max(losses) - min(losses) > 0.02  # against a window spread of ~1e-3
    step = steps.make_train_step(CFG, mesh)
    for _ in range(4):
        state, metrics = step(state, calm)
        assert int(metrics["skipped_spikes"]) == 0
    before = jax.device_get(state)
    state, metrics = step(state, spiky)
    assert int(metrics["skipped_spikes"]) == 1 and int(state.step) == 5
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params), before.params)
    spikes, spikes_before = optim.spike_state(state.opt_state), optim.spike_state(before.opt_state)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(spikes.inner_state), spikes_before.inner_state)
    want = loss_fn(before.params, model, spiky, prores.run_alphas(CFG, 4))  # the alphas of step 4
    assert int(spikes.last_step) == 4
    # the step's loss against the jitted loss_fn: measured equal, natively and with AVX2 only
    np.testing.assert_allclose(spikes.last_loss, want, rtol=1e-6)
    np.testing.assert_allclose(spikes.last_mean, np.mean(spikes_before.losses_W), rtol=1e-6)
    state, metrics = step(state, calm)
    assert int(metrics["skipped_spikes"]) == 1
    assert not np.array_equal(jax.device_get(state.params)["tok_embedding"], before.params["tok_embedding"])


def test_z_loss_is_the_mean_of_squared_log_normalisers():
    # log Z differs by position here (at init it is about ln V everywhere, where the mean of the squares
    # and the square of the mean agree)
    logits_BTV = np.array([[[0.0, 0.0, 0.0], [6.0, 0.0, -2.0]], [[1.0, 2.0, 3.0], [-4.0, -4.0, 9.0]]], np.float32)
    log_z_BT = np.log(np.sum(np.exp(logits_BTV.astype(np.float64)), axis=-1))
    # float32 against float64: measured 2.4e-8 relative, natively and with XLA_FLAGS=--xla_cpu_max_isa=AVX2
    np.testing.assert_allclose(steps.z_loss_term(jnp.asarray(logits_BTV), 0.05), 0.05 * np.mean(log_z_BT ** 2),
                               rtol=1e-6)


def test_z_loss_adds_its_term_to_the_gradient_and_is_logged_apart():
    coef = 0.05
    cfg = dataclasses.replace(CFG, optim=dataclasses.replace(CFG.optim, skip_spikes=0.0, z_loss=coef, lr=1e-2))
    mesh = steps.make_mesh(cfg)
    state = steps.create_state(cfg, jax.random.key(0), mesh)
    tokens = jax.random.randint(jax.random.key(2), (4, 17), 0, 300)
    model = model_lib.Andrea(cfg.model, padded_logits=True)
    alphas = prores.run_alphas(cfg, 0)

    def by_hand(params):  # log Z over the real vocabulary (the padding is at the float32 minimum)
        logits = model_lib.Andrea(cfg.model).apply({"params": params}, tokens[:, :-1], alphas).logits
        log_z = jax.scipy.special.logsumexp(logits, axis=-1)
        return steps.loss_fn(params, model, tokens, alphas) + coef * jnp.mean(log_z ** 2), coef * jnp.mean(log_z ** 2)

    def with_and_without_z(params):  # the gradients with and without the z-loss term, compiled as one program
        return (jax.value_and_grad(by_hand, has_aux=True)(params),
                jax.grad(lambda p: steps.loss_fn(p, model, tokens, alphas))(params))

    ((want_total, want_z), want_grads), grads_plain = jax.jit(with_and_without_z)(state.params)
    # in float64 numpy: optax.tree.norm op by op would compile its operations for every leaf's shape
    global_norm = lambda tree: np.sqrt(sum(np.sum(np.square(np.asarray(g, np.float64))) for g in jax.tree.leaves(tree)))
    params = jax.device_get(state.params)
    new_state, metrics = steps.make_train_step(cfg, mesh)(state, tokens)
    assert float(want_z) > 1e-3  # log Z is about ln V at init: a term that changes the gradient
    np.testing.assert_allclose(metrics["z_loss"], want_z, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss"], want_total - want_z, rtol=1e-6)  # the cross-entropy; measured equal
    # two programs sum the gradient in two orders: measured 2.6e-8 relative, 3.4e-8 under AVX2
    np.testing.assert_allclose(metrics["grad_norm"], global_norm(want_grads), rtol=1e-6)
    assert abs(global_norm(grads_plain) - float(metrics["grad_norm"])) > 1e-4
    assert not np.array_equal(jax.device_get(new_state.params)["tok_embedding"], params["tok_embedding"])


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_qk_norm_normalises_each_head_s_queries_and_keys(family):
    base = ModelConfig(vocab_size=300, seq_len=16, d_model=32, n_layer=2, n_head=4, family=family)
    cfg = dataclasses.replace(base, qk_norm=True)
    K = 32 // 4
    params = model_lib.init(cfg, jax.random.key(0))["params"]
    plain = model_lib.param_shapes(base)  # only its names are compared: no values to compute
    # Two gains of the head dim per block, from 1; the rest of the tree is the model's without them.
    assert model_lib.count_params(cfg) == model_lib.count_params(base) + 2 * K * 2
    assert set(params["blocks"]) - set(plain["blocks"]) == {"attn_q_norm_scale", "attn_k_norm_scale"}
    assert params["blocks"]["attn_q_norm_scale"].shape == (2, K) and np.all(params["blocks"]["attn_k_norm_scale"] == 1)

    # The attention of the first block against a transcription: q, k RMS-normalised per head.
    from andrea_jax.model import layers
    y_BTD = jax.random.normal(jax.random.key(3), (2, 5, 32))
    blk = {n: v[0] for n, v in params["blocks"].items()}
    gains = (np.linspace(0.5, 1.5, K, dtype=np.float32), np.linspace(2.0, 1.0, K, dtype=np.float32))
    # with llama's RoPE after the norm: rotation mixes a head's dimensions in pairs, so the gains of q
    # and of k no longer enter the scores only as their product, and swapping them shows
    from andrea_jax.model import llama
    rotate = ((lambda x: llama.apply_rope(x, llama.rope_tables(jnp.arange(5)[None].repeat(2, 0), K)))
              if family == "llama" else None)
    attention = jax.jit(functools.partial(layers.attention, rotate=rotate), static_argnums=5)  # op by op,
    # each operation would compile alone
    got, _ = attention(y_BTD, blk["attn_qkv_kernel"], blk.get("attn_qkv_bias"), blk["attn_out_kernel"],
                       blk.get("attn_out_bias"), cfg, qk_gains=gains)
    # The transcription in float64 numpy, from the same float32 inputs.
    y_BTD, blk = np.asarray(y_BTD, np.float64), {n: np.asarray(v, np.float64) for n, v in blk.items()}
    qkv = (y_BTD @ blk["attn_qkv_kernel"] + blk.get("attn_qkv_bias", 0.0)).reshape(2, 5, 3, 4, K)
    rms = lambda x, g: x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + cfg.ln_eps) * g
    q, k, v = rms(qkv[:, :, 0], gains[0]), rms(qkv[:, :, 1], gains[1]), qkv[:, :, 2]
    if family == "llama":   # pair i = (x_i, x_{i+K/2}) turned by position * 10000^(-2i/K)
        angle = np.arange(5)[None, :, None, None] * 10000.0 ** (-2 * np.arange(K // 2) / K)
        turn = lambda x: np.concatenate([x[..., :K // 2] * np.cos(angle) - x[..., K // 2:] * np.sin(angle),
                                         x[..., K // 2:] * np.cos(angle) + x[..., :K // 2] * np.sin(angle)], -1)
        q, k = turn(q), turn(k)
    scores = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(K) + np.where(np.tri(5, dtype=bool), 0, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    o = np.einsum("bhts,bshk->bthk", weights / weights.sum(-1, keepdims=True), v).reshape(2, 5, 32)
    want = o @ blk["attn_out_kernel"] + blk.get("attn_out_bias", 0.0)
    # outputs up to 0.035; against the float64 transcription measured 6.1e-9 (gpt2) and 6.3e-9 (llama, with
    # RoPE), natively and under AVX2: 1e-7 allows a float32 one
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)

    # The cached forward (a prefill, then token by token) equals the full one.
    tokens = jax.random.randint(jax.random.key(4), (2, 9), 0, 300)
    alphas = jnp.array([1.0, 0.5])
    apply = jitted(cfg)
    full = apply(params, tokens, alphas).logits
    np.testing.assert_allclose(cached_logits(cfg, apply, params, tokens, alphas, prefill_len=4), full,
                               rtol=0, atol=2e-5)  # as tests/test_llama.py

    # Export refuses it: neither transformers' GPT-2 nor its Llama has a norm on queries and keys.
    reason = hf.refusal(cfg)
    assert reason.startswith("model.qk_norm=true cannot be exported as Hugging Face") and "--format native" in reason
    assert hf.refusal(base) is None


def test_switching_spike_skipping_on_or_off_is_refused_on_resume_but_its_sigmas_may_change():
    off, on = Config().to_dict(), Config(optim=OptimConfig(skip_spikes=3.0)).to_dict()
    assert [s.split(" ")[0] for s in changed_settings(off, on)[0]] == ["optim.skip_spikes"]
    assert [s.split(" ")[0] for s in changed_settings(on, off)[0]] == ["optim.skip_spikes"]
    more = Config(optim=OptimConfig(skip_spikes=5.0)).to_dict()
    assert changed_settings(on, more) == ([], ["optim.skip_spikes (saved 3.0, now 5.0)"])
    wider = Config(optim=OptimConfig(skip_spikes=3.0, skip_spikes_window=50)).to_dict()
    assert changed_settings(on, wider)[0] == ["optim.skip_spikes_window (saved 100, now 50)"]
