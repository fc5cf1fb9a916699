"""Numerics under bfloat16 and the parts of the step that exist for speed: the float32 residual
stream, the padded vocabulary, the attention backend."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from andrea_jax import model as model_lib
from andrea_jax.train import steps
from andrea_jax.config import Config, ModelConfig, OptimConfig, ProResConfig, TrainConfig
from andrea_jax.kernels import reference

SMALL = ModelConfig(vocab_size=300, seq_len=16, d_model=64, n_layer=2, n_head=4)
# One jitted loss-and-gradients of steps.loss_fn, as the train step runs it, and one batch shape: the
# tests that take a loss or gradients of SMALL share its programs, one per model and dtype.
loss_and_grads = jax.jit(jax.value_and_grad(steps.loss_fn), static_argnums=1)
BATCH_SHAPE = (3, SMALL.seq_len + 1)


def block_delta(cfg, alpha, x_BTD, seed=0):
    """x_out - x_in of one block at the given alpha, as float32."""
    out = _block_out(cfg, jnp.float32(alpha), x_BTD, seed, "auto")
    assert out.dtype == jnp.float32  # the stream stays float32 under bf16 compute
    return np.asarray(out - x_BTD, np.float64)


@functools.partial(jax.jit, static_argnums=(0, 3, 4))  # as the train step runs a block: compiled whole
def _block_out(cfg, alpha, x_BTD, seed, impl="auto"):
    """One block's output at `alpha`, its parameters initialised from `seed`, its kernels from `impl`."""
    variables = model_lib.Block(cfg).init(jax.random.key(seed), x_BTD, (alpha, jnp.int32(1)))
    return model_lib.Block(cfg, impl).apply(variables, x_BTD, (alpha, jnp.int32(1)))[0]


def test_a_tiny_prores_branch_survives_the_residual_add_under_bf16():
    x = 4.0 * jax.random.normal(jax.random.key(1), (2, 16, 64))  # a grown stream: bf16 ulp ~ 1.6e-2
    for norm in ("pre", "lns", "sandwich"):
        c32 = dataclasses.replace(SMALL, norm=norm)
        d16, d32 = block_delta(dataclasses.replace(c32, dtype="bfloat16"), 1e-3, x), block_delta(c32, 1e-3, x)
        # What the block adds at alpha 1e-3, bf16 compute vs float32 compute. Measured: relative
        # error 6.5e-3 (pre, lns) and 4.6e-3 (sandwich), the bf16 rounding of the branch itself;
        # 0.34% of the elements add nothing (float32 model: 0.2%, branch values below x's float32
        # ulp). A bf16 stream instead loses 94-99.9% of the branch and leaves 92-99.9% unchanged.
        rel = np.linalg.norm(d16 - d32) / np.linalg.norm(d32)
        assert rel < 2e-2, (norm, rel)
        assert np.mean(d16 == 0.0) < 1e-2, norm


def test_both_sublayers_see_the_same_float32_alpha_in_every_backend():
    """alpha = 1/3 is not a bf16 number: a bf16 cast in one add would move the output by ~1e-3."""
    x = jax.random.normal(jax.random.key(2), (2, 16, 64))
    alpha = 1.0 / 3.0
    bf16 = dataclasses.replace(SMALL, dtype="bfloat16")
    got = {impl: np.asarray(_block_out(bf16, jnp.float32(alpha), x, 0, impl)) for impl in ("xla", "pallas")}
    # measured equal (natively and under AVX2); an alpha rounded to bf16 in any add moves the output by 1.1e-4
    np.testing.assert_allclose(got["pallas"], got["xla"], rtol=0, atol=1e-6)
    rounded = float(jnp.bfloat16(alpha))
    other = np.asarray(_block_out(bf16, jnp.float32(rounded), x, 0, "xla"))
    assert np.abs(other - got["xla"]).max() > 5e-5


def test_bf16_loss_tracks_float32():
    params = model_lib.init(SMALL, jax.random.key(0))["params"]
    tokens = jax.random.randint(jax.random.key(3), BATCH_SHAPE, 0, SMALL.vocab_size)
    alphas = jnp.array([1.0, 0.5])
    loss = lambda cfg: float(loss_and_grads(params, model_lib.Andrea(cfg), tokens, alphas)[0])
    l32, l16 = loss(SMALL), loss(dataclasses.replace(SMALL, dtype="bfloat16"))
    # measured |l16 - l32| = 8.7e-5 on a loss of 5.76 (bf16 matmuls; float32 stream, softmax and loss)
    assert abs(l16 - l32) < 3e-3, (l16, l32)


def test_padded_vocabulary_gives_the_unpadded_loss_and_gradients():
    assert model_lib.padded_vocab(8449) == 8576 and model_lib.padded_vocab(300) == 384
    assert model_lib.padded_vocab(256) == 256
    params = model_lib.init(SMALL, jax.random.key(0))["params"]
    tokens = jax.random.randint(jax.random.key(4), (3, 17), 0, SMALL.vocab_size)
    alphas = jnp.array([1.0, 0.7])
    model = model_lib.Andrea(SMALL)

    def unpadded_loss(p):  # the head written out over the true vocabulary, no padding anywhere
        logits = model.apply({"params": p}, tokens[:, :-1], alphas).logits  # padded inside, cut to V
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean(), logits

    def reference_loss(p):  # the same network with the head as a plain float32 matmul over V
        x = p["tok_embedding"][tokens[:, :-1]] + p["pos_embedding"][:16]
        for l in range(SMALL.n_layer):
            x, _ = model_lib.Block(SMALL).apply({"params": jax.tree.map(lambda a: a[l], p["blocks"])}, x,
                                                (alphas[l], jnp.int32(l + 1)))
        y = reference.layer_norm(x, p["lnf_scale"], p["lnf_bias"], eps=SMALL.ln_eps)
        logits = y @ p["tok_embedding"].T
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean(), logits

    (l1, logits1), g1 = jax.jit(jax.value_and_grad(unpadded_loss, has_aux=True))(params)
    (l2, logits2), g2 = jax.jit(jax.value_and_grad(reference_loss, has_aux=True))(params)
    assert logits1.shape[-1] == SMALL.vocab_size
    assert jax.tree.map(jnp.shape, g1) == jax.tree.map(jnp.shape, params)  # gradients unpadded too
    # measured: losses equal, logits 2.4e-7 apart, gradients at most 8.9e-8 (float32 rounding of
    # a differently tiled matmul); the padded rows' gradients are dropped with the padding
    np.testing.assert_allclose(l1, l2, rtol=1e-6)
    np.testing.assert_allclose(logits1, logits2, rtol=0, atol=2e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(a, b, rtol=0, atol=5e-7)
    assert model_lib.count_params(SMALL) == sum(int(p.size) for p in jax.tree.leaves(params))


def test_xla_attention_equals_written_out_softmax_attention_and_cudnn_falls_back_with_the_reason():
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 10, 4, 16)) for i in range(3))
    got = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))  # the reference in float64 numpy
    scores = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(16.0)
    scores = np.where(np.tril(np.ones((10, 10), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    want = np.einsum("bhts,bshk->bthk", weights / weights.sum(axis=-1, keepdims=True), v)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
    for choice in ("auto", "cudnn"):
        impl, why = model_lib.attention_impl(dataclasses.replace(SMALL, attention=choice, dtype="bfloat16"))
        assert impl == "xla" and "no GPU" in why  # this suite runs on CPU
    impl, why = model_lib.attention_impl(dataclasses.replace(SMALL, attention="auto"))
    assert impl == "xla" and "float32" in why
    assert model_lib.attention_impl(dataclasses.replace(SMALL, attention="xla")) == ("xla", "model.attention=xla")



def test_cudnn_attention_is_chosen_on_a_gpu_only_for_bf16_and_head_dims_it_takes(monkeypatch):
    from andrea_jax import kernels
    monkeypatch.setattr(kernels, "target_backend", lambda: "gpu")
    for d_model, n_head, ok in ((64, 4, True), (8, 1, True), (128, 1, True), (96, 8, False), (136, 1, False)):
        cfg = dataclasses.replace(SMALL, attention="auto", dtype="bfloat16", d_model=d_model, n_head=n_head)
        impl, why = model_lib.attention_impl(cfg)
        assert (impl, why) == (("cudnn", "model.attention=auto: cuDNN flash attention") if ok else
                               ("xla", f"model.attention=auto falls back to xla: head dim {d_model // n_head} "
                                       "(cuDNN needs a multiple of 8, at most 128)")), (d_model, n_head)
    impl, why = model_lib.attention_impl(dataclasses.replace(SMALL, attention="cudnn", dtype="float32"))
    assert impl == "xla" and why.endswith("model.dtype=float32 (cuDNN flash attention needs bfloat16)")


def test_the_steps_masked_padded_logits_give_the_same_loss_and_gradients():
    params = model_lib.init(SMALL, jax.random.key(0))["params"]
    tokens = jax.random.randint(jax.random.key(5), BATCH_SHAPE, 0, SMALL.vocab_size)
    alphas = jnp.array([0.6, 1.0])
    sliced, padded = model_lib.Andrea(SMALL), model_lib.Andrea(SMALL, padded_logits=True)
    padded_logits = jax.eval_shape(lambda p: padded.apply({"params": p}, tokens[:, :-1], alphas).logits, params)
    assert padded_logits.shape[-1] == 384
    l1, g1 = loss_and_grads(params, sliced, tokens, alphas)
    l2, g2 = loss_and_grads(params, padded, tokens, alphas)
    # measured: loss and gradients bit-identical on CPU (masked columns add exp(min) = 0)
    np.testing.assert_allclose(l2, l1, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g2), jax.tree.leaves(g1)):
        np.testing.assert_allclose(a, b, rtol=0, atol=5e-7)


TRAIN = Config(model=ModelConfig(vocab_size=300, seq_len=32, d_model=64, n_layer=2, n_head=4),
               prores=ProResConfig(schedule="linear", warmup=2), optim=OptimConfig(lr=3e-3, warmup_steps=2),
               train=TrainConfig(steps=10, batch_size=4))


def train_losses(cfg, batch):
    """Losses of cfg.train.steps jitted updates on one batch, from the same seed."""
    mesh = steps.make_mesh()
    state = steps.create_state(cfg, jax.random.key(0), mesh)
    step = steps.make_train_step(cfg, mesh)
    assert ("bf16" in step.lower(state, batch).as_text()) == (cfg.model.dtype == "bfloat16")  # it computes in dtype
    losses = []
    for _ in range(cfg.train.steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return np.asarray(losses), state


def test_bf16_training_follows_the_float32_trajectory():
    batch = np.asarray(jax.random.randint(jax.random.key(1), (4, 33), 0, 300), np.int32)
    bf16 = dataclasses.replace(TRAIN, model=dataclasses.replace(TRAIN.model, dtype="bfloat16"))
    l16, state16 = train_losses(bf16, batch)
    l32, _ = train_losses(TRAIN, batch)
    assert np.all(np.isfinite(l16)) and all(np.all(np.isfinite(p)) for p in jax.tree.leaves(state16.params))
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(state16.params))  # master weights stay float32
    # measured: 5.713 -> 4.360 in 10 steps (float32: 5.713 -> 4.360)
    assert l16[-1] < l16[0] - 1.0, l16
    # every update lowers the loss; the first runs at lr 0 (the LR warmup starts from 0)
    assert np.all(np.diff(l16[1:]) < 0), l16
    # measured max |bf16 - float32| over the 10 losses 3.8e-4 (relative 8.2e-5; CPU, jax 0.10.2)
    np.testing.assert_allclose(l16, l32, rtol=0, atol=2e-3)


def test_bf16_gradients_are_close_to_float32_gradients():
    params = model_lib.init(SMALL, jax.random.key(0))["params"]
    rng = np.random.default_rng(5)  # noise on every leaf: LayerNorm gains and biases matter
    params = jax.tree.map(lambda p: np.asarray(p) + 0.1 * rng.standard_normal(p.shape, np.float32), params)
    tokens = rng.integers(0, SMALL.vocab_size, BATCH_SHAPE).astype(np.int32)
    alphas = jnp.array([1.0, 0.6])
    grad = lambda c: loss_and_grads(params, model_lib.Andrea(c), tokens, alphas)[1]
    g32, g16 = grad(SMALL), grad(dataclasses.replace(SMALL, dtype="bfloat16"))
    rel = {}
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(g32)[0], jax.tree.leaves(g16)):
        assert b.dtype == jnp.float32  # gradients of the float32 parameters
        rel[jax.tree_util.keystr(path)] = float(np.linalg.norm(np.asarray(b) - a) / np.linalg.norm(a))
    # measured ||g16 - g32|| / ||g32|| per leaf: 4.1e-3 (lnf_bias) to 1.6e-2 (attn_qkv_bias); 8.4e-3
    # to 1.0e-2 for every kernel and embedding. bf16 keeps 8 bits: 2^-8 = 3.9e-3 per rounding; a
    # wrong or missing term of a backward pass is an O(1) relative error.
    assert max(rel.values()) < 4e-2, rel
    flat = lambda g: np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(g)])
    v32, v16 = flat(g32), flat(g16)
    # measured 9.0e-3 over all parameters together (cosine 0.99996)
    assert np.linalg.norm(v16 - v32) / np.linalg.norm(v32) < 2e-2
    assert np.linalg.norm(v16 - v32) / np.linalg.norm(v32) > 1e-3  # bf16 is really used


def test_the_loss_and_z_loss_of_bf16_logits_are_computed_in_float32():
    logits_bf16 = (4.0 * jax.random.normal(jax.random.key(5), (2, 8, 300))).astype(jnp.bfloat16)
    targets = jax.random.randint(jax.random.key(6), (2, 8), 0, 300)
    logits_f32 = logits_bf16.astype(jnp.float32)  # the same values, exactly
    assert float(steps.cross_entropy(logits_bf16, targets)) == float(steps.cross_entropy(logits_f32, targets))
    assert float(steps.z_loss_term(logits_bf16, 1e-4)) == float(steps.z_loss_term(logits_f32, 1e-4))
