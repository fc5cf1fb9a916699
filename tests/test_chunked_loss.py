"""model.loss_chunks: the cross-entropy and z-loss formed a chunk of positions at a time
(andrea_jax.train.chunked_loss) against the plain loss over the whole logits, in value and gradient:
of the head's operands, of the model's parameters (the tied embedding and llama's untied head), and
through one train step with z-loss and the document mask, on one device and on 8 under meshes; and
the chunked program never holds the whole logits, and runs its matmuls as the plain head does."""
import dataclasses
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from andrea_jax import config as config_lib
from andrea_jax.config import Config, ConfigError, DataConfig, ModelConfig, OptimConfig, ProResConfig, TrainConfig
from andrea_jax.model import layers
from andrea_jax.train import chunked_loss, steps
from _devices import cpu_devices_env
from _helpers import PROGRAMS, perturbed_params
from _jaxpr import all_eqns

EOT = 0
V, P, D = 300, layers.padded_vocab(300), 32  # 84 padding columns
Z = 0.05  # a z-loss coefficient large enough that its gradient matters beside the cross-entropy's
# Max |chunked - plain| / max |plain| over values and every gradient leaf. Measured in float32: 2.9e-7
# (operands), 3.2e-7 (each term alone), 4.7e-7 (model, both families), 6.0e-7 (a train step's
# gradients); in bfloat16: 1.4e-7 (model; 2.1e-7 under AVX2), 3.5e-4 (operands, 4 chunks: the head's
# gradient summed over chunks in float32 rounds to another bfloat16 in a few entries). Otherwise the same
# under XLA_FLAGS=--xla_cpu_max_isa=AVX2. A few times above:
F32_TOL, BF16_TOL = 2e-6, 1e-3


def rel_diff(got, want) -> float:
    """The largest, over the leaves, of a leaf's max |got - want| over its max |want|."""
    pairs = zip(jax.tree.leaves(got), jax.tree.leaves(want))
    return max(float(np.max(np.abs(np.asarray(g).astype(np.float32) - np.asarray(w).astype(np.float32))))
               / float(np.max(np.abs(np.asarray(w).astype(np.float32)))) for g, w in pairs)


def plain_objective(y_BTD, w_DP, targets_BT):
    """The plain path's loss on the same operands: the model's padded logits, steps' two terms."""
    logits_BTP = layers.logits_matmul(y_BTD, w_DP)
    logits_BTP = jnp.where(jnp.arange(P) < V, logits_BTP, jnp.finfo(jnp.float32).min)
    return steps.cross_entropy(logits_BTP, targets_BT) + steps.z_loss_term(logits_BTP, Z)


def chunked_objective(y_BTD, w_DP, targets_BT, chunks):
    ce, mean_sq_lse = chunked_loss.losses(y_BTD, w_DP, targets_BT, V, chunks)
    return ce + Z * mean_sq_lse


def operands(dtype, B=3, T=16):
    ky, kw, kt = jax.random.split(jax.random.key(0), 3)
    y_BTD = jax.random.normal(ky, (B, T, D)).astype(dtype)
    w_DP = (0.3 * jax.random.normal(kw, (D, P))).astype(dtype)
    return y_BTD, w_DP, jax.random.randint(kt, (B, T), 0, V)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, F32_TOL), (jnp.bfloat16, BF16_TOL)])
@pytest.mark.parametrize("chunks", [1, 4, 16])
def test_value_and_gradients_of_the_head_operands_equal_the_plain_loss(dtype, tol, chunks):
    y_BTD, w_DP, targets_BT = operands(dtype)
    grad = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(y_BTD, w_DP)
    want = grad(lambda y, w: plain_objective(y, w, targets_BT))
    got = grad(lambda y, w: chunked_objective(y, w, targets_BT, chunks))
    diff = rel_diff(got, want)
    print(f"{jnp.dtype(dtype).name} chunks={chunks}: max relative difference {diff:.2e}")
    assert diff <= tol
    assert got[1][0].dtype == dtype and got[1][1].dtype == dtype


def test_the_two_terms_and_their_gradients_apart():
    """Cross-entropy alone and the squared log-normaliser alone, so neither term's gradient can hide
    behind the other's."""
    y_BTD, w_DP, targets_BT = operands(jnp.float32)
    logits = lambda y, w: jnp.where(jnp.arange(P) < V, layers.logits_matmul(y, w), jnp.finfo(jnp.float32).min)
    plain = {"ce": lambda y, w: steps.cross_entropy(logits(y, w), targets_BT),
             "sq": lambda y, w: steps.z_loss_term(logits(y, w), 1.0)}
    for i, name in enumerate(plain):
        want = jax.jit(jax.value_and_grad(plain[name], argnums=(0, 1)))(y_BTD, w_DP)
        got = jax.jit(jax.value_and_grad(lambda y, w: chunked_loss.losses(y, w, targets_BT, V, 4)[i], argnums=(0, 1)))(
            y_BTD, w_DP)
        diff = rel_diff(got, want)
        print(f"{name}: max relative difference {diff:.2e}")
        assert diff <= F32_TOL


def model_cfg(family: str, chunks: int, dtype: str = "float32") -> ModelConfig:
    return ModelConfig(vocab_size=V, seq_len=16, d_model=D, n_layer=3, n_head=4, family=family, dtype=dtype,
                       loss_chunks=chunks)


def packed_batch(B=2, seed=0):
    """[B, 17] tokens with an end-of-text inside each row: two documents a row."""
    tokens = np.random.default_rng(seed).integers(1, V, (B, 17)).astype(np.int32)
    tokens[:, 6] = EOT
    return jnp.asarray(tokens)


@pytest.mark.parametrize("dtype,tol", [("float32", F32_TOL), ("bfloat16", BF16_TOL)])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_model_objective_and_its_parameter_gradients_equal_the_plain_ones(family, dtype, tol):
    """gpt2's head is its token embedding, whose gradient then sums the lookup's and the head's;
    llama's is lm_head_kernel. z-loss on, the document mask on."""
    alphas_L = jnp.array([0.9, 0.45, 0.2], jnp.float32)
    tokens_BT1 = packed_batch()
    params = perturbed_params(model_cfg(family, 0))

    def run(chunks):
        cfg = Config(model=model_cfg(family, chunks, dtype))
        model = steps.loss_model(cfg)
        grad = jax.value_and_grad(steps.objective, has_aux=True)
        (total, (ce, aux)), grads = jax.jit(lambda p: grad(p, model, tokens_BT1, alphas_L, Z, EOT))(params)
        return (total, ce, aux["z_loss"]), grads

    want, got = run(0), run(4)
    diff = rel_diff(got, want)
    print(f"{family} {dtype}: max relative difference {diff:.2e}")
    assert diff <= tol
    head = "tok_embedding" if family == "gpt2" else "lm_head_kernel"
    assert float(jnp.max(jnp.abs(got[1][head]))) > 0


def train_cfg(chunks: int) -> Config:
    return config_lib.validate(Config(
        model=model_cfg("gpt2", chunks), optim=OptimConfig(z_loss=Z, warmup_steps=0, lr=1e-2),
        prores=ProResConfig(schedule="none"),  # every block on from step 0, so every parameter moves
        train=TrainConfig(batch_size=2, steps=10), data=DataConfig(document_mask=True)))


def step_results(chunks: int, batch):
    """(the state after one train step, its metrics, the eval step's loss and the knockout step's
    losses (vmapped over the blocks) at the initial parameters)."""
    cfg = train_cfg(chunks)
    mesh = steps.make_mesh(cfg)
    state = steps.create_state(cfg, jax.random.key(0), mesh)
    params = jax.device_get(state.params)
    new_state, metrics = steps.make_train_step(cfg, mesh, eot_id=EOT)(state, batch)
    eval_loss, _ = steps.make_eval_step(cfg, mesh, eot_id=EOT)(params, np.int32(0), batch, np.ones(V, np.int32))
    knockout_L = steps.make_knockout_step(cfg, mesh, eot_id=EOT)(params, np.int32(0), batch)
    return jax.device_get(new_state), jax.device_get(metrics), (float(eval_loss), np.asarray(knockout_L))


def test_the_train_eval_and_knockout_steps_with_chunks_equal_them_without():
    """Adam's first moment after one step is 0.1 x the clipped gradient: the gradients compared
    exactly. The parameters moved by lr x m / (sqrt(v) + eps), which for a gradient that is only
    rounding noise (the attention keys' bias: the softmax ignores it) amplifies the noise to a
    fraction of lr: measured 0.004 lr; allowed 0.05 lr."""
    batch = packed_batch()
    (state0, metrics0, eval0), (state4, metrics4, eval4) = step_results(0, batch), step_results(4, batch)
    mu = lambda state: optax.tree_utils.tree_get(state.opt_state, "mu")
    grad_diff = max(rel_diff(a, b) for a, b in zip(jax.tree.leaves(mu(state4)), jax.tree.leaves(mu(state0))))
    param_diff = max(float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(state4.params),
                                                                     jax.tree.leaves(state0.params)))
    lr = train_cfg(0).optim.lr
    print(f"train step: gradients' max relative difference {grad_diff:.2e}, parameters' {param_diff / lr:.2e} lr; "
          f"metrics {metrics4} against {metrics0}; eval and knockout losses {eval4} against {eval0}")
    assert grad_diff <= F32_TOL
    assert param_diff <= 0.05 * lr
    assert sorted(metrics4) == sorted(metrics0) and "z_loss" in metrics4
    for key in ("loss", "z_loss", "grad_norm"):
        np.testing.assert_allclose(metrics4[key], metrics0[key], rtol=F32_TOL)
    for got, want in zip(eval4, eval0):
        np.testing.assert_allclose(got, want, rtol=F32_TOL)


def float32_logit_sized(fn, *args, rows: int) -> list[tuple]:
    """Shapes of float32 arrays in fn's traced program, its gradient included, with at least `rows`
    rows of P columns, but for the head's own shape [D, P] (the head's gradient, summed over chunks)."""
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    avals = [v.aval for eqn in all_eqns(jaxpr) for v in eqn.outvars]
    return [a.shape for a in avals if a.dtype == jnp.float32 and a.shape and a.shape[-1] == P
            and a.size >= rows * P and a.shape != (D, P)]


def test_the_chunked_program_never_holds_the_whole_logits_or_their_gradient():
    y_BTD, w_DP, targets_BT = operands(jnp.bfloat16)
    B, T = targets_BT.shape
    grad = lambda f: jax.grad(f, argnums=(0, 1))
    plain = float32_logit_sized(grad(lambda y, w: plain_objective(y, w, targets_BT)), y_BTD, w_DP, rows=B * T)
    chunked = float32_logit_sized(grad(lambda y, w: chunked_objective(y, w, targets_BT, 4)), y_BTD, w_DP,
                                  rows=B * T // 4 + 1)
    assert (B, T, P) in plain
    assert chunked == []


def test_the_train_and_eval_steps_with_chunks_never_hold_the_whole_logits():
    batch = packed_batch()
    rows = batch.shape[0] * (batch.shape[1] - 1)

    def logit_sized(chunks):
        cfg = train_cfg(chunks)
        mesh = steps.make_mesh(cfg)
        state = steps.create_state(cfg, jax.random.key(0), mesh)
        train = float32_logit_sized(steps.make_train_step(cfg, mesh, eot_id=EOT), state, batch, rows=rows // 4 + 1)
        evaluate = float32_logit_sized(steps.make_eval_step(cfg, mesh, eot_id=EOT), state.params, np.int32(0),
                                       batch, np.ones(V, np.int32), rows=rows // 4 + 1)
        return train, evaluate

    plain_train, plain_eval = logit_sized(0)
    assert (2, 16, P) in plain_train and (2, 16, P) in plain_eval
    assert logit_sized(4) == ([], [])


def test_a_chunk_count_that_does_not_divide_the_positions_is_refused_naming_the_setting():
    with pytest.raises(ConfigError, match=r"^model.loss_chunks: must be 0 \(off\) or divide model.seq_len=16, got 5$"):
        config_lib.validate(dataclasses.replace(train_cfg(0), model=model_cfg("gpt2", 5)))
    with pytest.raises(ConfigError, match=r"^model.loss_chunks: .* got -1$"):
        config_lib.validate(dataclasses.replace(train_cfg(0), model=model_cfg("gpt2", -1)))
    y_BTD, w_DP, targets_BT = operands(jnp.float32, T=15)
    with pytest.raises(ValueError, match=r"^model.loss_chunks=4 must divide the 15 positions of a row$"):
        chunked_loss.losses(y_BTD, w_DP, targets_BT, V, 4)



def test_the_chunked_matmuls_take_bfloat16_operands_and_accumulate_in_float32():
    """As model.layers.logits_matmul's: no float32 x float32 matmul from an upcast cotangent."""
    y_BTD, w_DP, targets_BT = operands(jnp.bfloat16)
    jaxpr = jax.make_jaxpr(jax.grad(lambda y, w: chunked_objective(y, w, targets_BT, 4), argnums=(0, 1)))(y_BTD, w_DP)
    dots = [(tuple(str(v.aval.dtype) for v in e.invars), str(e.params["preferred_element_type"]))
            for e in all_eqns(jaxpr.jaxpr) if e.primitive.name == "dot_general"]
    assert dots == [(("bfloat16", "bfloat16"), "float32")] * 4  # the forward's; the backward's logits, dy and dw


def test_the_chunked_train_step_on_8_devices_equals_the_plain_one_on_one():
    """Meshes that split the rows (data, fsdp) and the vocabulary (tensor), two steps. Measured at most
    2.4e-5 (mesh 2x2x2; the plain loss on the same meshes: 1.6e-5, so the sharding's own rounding);
    allowed 1e-4."""
    proc = subprocess.run([sys.executable, str(PROGRAMS / "chunked_loss_sharded.py"), "1e-4"], env=cpu_devices_env(8),
                          capture_output=True, text=True, timeout=600)
    print(proc.stdout)
    assert proc.returncode == 0 and "ALL OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("against one device plain") == 4
