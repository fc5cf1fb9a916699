"""data.document_mask and model.reset_positions against the unfeatured model: a packed row's
documents are computed as if each stood alone at the start of a row."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _helpers import forward_logits
from andrea_jax import config as config_lib, configs, model as model_lib, workdir
from andrea_jax.config import ConfigError, ModelConfig
from andrea_jax.data import segments
from andrea_jax.model import prores
from andrea_jax.train import steps

EOT = 0
ALPHAS = jnp.array([0.9, 0.45, 0.2], jnp.float32)  # mid-warmup: every block partly on
# Packed against alone, float32: at most 1.2e-7 measured over both families and the five placements
# (logits up to 0.7), the same with XLA_FLAGS=--xla_cpu_max_isa=AVX2; 8x margin.
LOGITS_ATOL = 1e-6


def small(family: str, reset_positions: bool = True) -> ModelConfig:
    return ModelConfig(vocab_size=300, seq_len=16, d_model=32, n_layer=3, n_head=4, family=family,
                       reset_positions=reset_positions)


def packed_row(n_first: int = 5, n_second: int = 10, seed: int = 0):
    """(row [1, n_first + 1 + n_second], first document, second document): no EOT inside either."""
    rng = np.random.default_rng(seed)
    first, second = rng.integers(1, 300, n_first), rng.integers(1, 300, n_second)
    return np.concatenate([first, [EOT], second])[None].astype(np.int32), first, second


@functools.partial(jax.jit, static_argnames=("cfg", "documents"))  # op by op, every operation compiles alone
def logits(cfg, params, tokens_BT, documents: bool):
    inputs = {}
    if documents:
        segment_ids_BT, positions_BT = segments.document_segments(tokens_BT, EOT)
        inputs = {"segment_ids_BT": segment_ids_BT} | ({"positions_BT": positions_BT} if cfg.reset_positions else {})
    return model_lib.Andrea(cfg).apply({"params": params}, jnp.asarray(tokens_BT), ALPHAS, **inputs).logits[0]


def test_segment_ids_and_positions_of_a_hand_made_row():
    row = np.array([[5, 6, EOT, 7, 8, 9, EOT, EOT, 3]], np.int32)
    segment_ids_BT, positions_BT = segments.document_segments(row, EOT)
    # a document starts after each EOT, which ends its own; an empty document is the EOT alone
    assert np.asarray(segment_ids_BT).tolist() == [[0, 0, 0, 1, 1, 1, 1, 2, 3]]
    assert np.asarray(positions_BT).tolist() == [[0, 1, 2, 0, 1, 2, 3, 0, 0]]
    assert segment_ids_BT.dtype == positions_BT.dtype == jnp.int32


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_second_document_of_a_packed_row_matches_it_alone_at_the_start_of_a_row(family):
    cfg = small(family)
    params = model_lib.init(cfg, jax.random.key(1))["params"]
    row, first, second = packed_row()
    packed = logits(cfg, params, row, documents=True)
    alone = logits(cfg, params, second[None].astype(np.int32), documents=False)
    np.testing.assert_allclose(packed[len(first) + 1:], alone, rtol=0, atol=LOGITS_ATOL)
    # the first document (its EOT included) is unchanged by what follows it
    head = logits(cfg, params, row[:, :len(first) + 1], documents=False)
    np.testing.assert_allclose(packed[:len(first) + 1], head, rtol=0, atol=LOGITS_ATOL)
    # without the mask the second document sees the first
    assert np.max(np.abs(logits(cfg, params, row, documents=False)[len(first) + 1:] - alone)) > 100 * LOGITS_ATOL


def test_learned_positions_without_reset_see_the_offset_of_the_document():
    cfg = small("gpt2", reset_positions=False)
    params = model_lib.init(cfg, jax.random.key(1))["params"]
    row, first, second = packed_row()
    packed = logits(cfg, params, row, documents=True)
    alone = logits(cfg, params, second[None].astype(np.int32), documents=False)
    assert np.max(np.abs(packed[len(first) + 1:] - alone)) > 100 * LOGITS_ATOL


def tiny(*overrides):
    return config_lib.validate(config_lib.override(configs.load("tiny"), [
        "model.seq_len=16", "model.n_layer=2", "model.d_model=32", "train.batch_size=2", *overrides]))


def test_train_and_eval_step_losses_with_the_mask_are_the_documents_loss_alone():
    cfg = tiny("data.document_mask=true", "model.reset_positions=true")
    mesh = steps.make_mesh(cfg)
    rows = [packed_row(4, 11, seed=s)[0] for s in (0, 1)]
    batch = np.concatenate(rows)  # [2, 17]: inputs of 16 tokens and their targets
    state = steps.create_state(cfg, jax.random.key(0), mesh)
    params = jax.device_get(state.params)
    _, masked = steps.make_train_step(cfg, mesh, eot_id=EOT)(state, batch)
    plain_cfg = tiny()
    _, plain = steps.make_train_step(plain_cfg, mesh)(steps.create_state(plain_cfg, jax.random.key(0), mesh), batch)
    # reference: the unfeatured model on each document alone (the EOT predicts from its own document)
    model, alphas = model_lib.Andrea(plain_cfg.model), prores.run_alphas(plain_cfg, 0)
    nll = []
    for row in batch:
        inputs, targets = row[:-1], row[1:]
        for doc in (slice(0, 5), slice(5, None)):
            out = forward_logits(model, params, jnp.asarray(inputs[doc][None]), alphas)[0]
            nll.append(-jax.nn.log_softmax(out)[np.arange(len(out)), targets[doc]])
    reference = float(jnp.mean(jnp.concatenate(nll)))
    np.testing.assert_allclose(float(masked["loss"]), reference, rtol=1e-6)
    assert abs(float(masked["loss"]) - float(plain["loss"])) > 1e-3
    # the eval step scores the same batch with the parameters the train step started from
    bytes_V = np.ones(cfg.model.vocab_size, np.int32)
    eval_loss, _ = steps.make_eval_step(cfg, mesh, eot_id=EOT)(params, np.int32(0), batch, bytes_V)
    np.testing.assert_allclose(float(eval_loss), float(masked["loss"]), rtol=1e-6)


def test_reset_positions_without_the_document_mask_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^model.reset_positions: .*data.document_mask=true$"):
        tiny("model.reset_positions=true")


def test_an_odd_seq_len_is_refused_where_cudnn_could_take_the_mask():
    with pytest.raises(ConfigError, match=r"^data.document_mask: cuDNN attention .* got 15: use an even one"):
        tiny("data.document_mask=true", "model.seq_len=15")
    tiny("data.document_mask=true", "model.seq_len=15", "model.attention=xla")  # XLA's mask has no such limit


def test_a_resume_may_not_switch_document_masking_and_an_older_run_counts_as_off():
    saved, now = tiny().to_dict(), tiny("data.document_mask=true", "model.reset_positions=true").to_dict()
    identity, _ = workdir.changed_settings(saved, now)
    assert identity == ["model.reset_positions (saved False, now True)", "data.document_mask (saved False, now True)"]
    older = {s: {k: v for k, v in f.items() if k not in ("document_mask", "reset_positions")} for s, f in saved.items()}
    assert workdir.changed_settings(older, saved) == ([], [])


def test_the_kv_cache_refuses_segment_ids():
    from andrea_jax.model import layers
    cfg = small("gpt2")
    blk = {n: v[0] for n, v in model_lib.init(cfg, jax.random.key(0))["params"]["blocks"].items()}
    k, v = model_lib.empty_cache(cfg, 1)
    cache = (k[0], v[0], jnp.int32(0), jnp.ones((1, cfg.seq_len), bool))
    refused = "^document segment ids are for training's packed rows; the KV cache takes none$"
    with pytest.raises(ValueError, match=refused):
        layers.attention(jnp.zeros((1, 4, 32)), blk["attn_qkv_kernel"], blk["attn_qkv_bias"], blk["attn_out_kernel"],
                         blk["attn_out_bias"], cfg, cache=cache, segment_ids_BT=jnp.zeros((1, 4), jnp.int32))
