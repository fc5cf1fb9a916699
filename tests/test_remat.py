"""model.remat = none | full | dots | gelu: the same loss and gradients, and each stores less for
the backward pass than none (the vjp's residuals, counted exactly, not timed)."""
import dataclasses
import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import config as config_lib, model as model_lib
from andrea_jax.config import ModelConfig
from _jaxpr import all_eqns

TINY = ModelConfig(vocab_size=300, seq_len=16, d_model=32, n_layer=3, n_head=4)
ALPHAS = jnp.array([0.3, 1.0, 0.7])


@functools.lru_cache  # `none` is every test's reference: computed once
def loss_and_vjp(remat: str):
    cfg = dataclasses.replace(TINY, remat=remat)
    params = model_lib.init(TINY, jax.random.key(0))["params"]
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, TINY.vocab_size)

    def loss(p):
        logits = model_lib.Andrea(cfg, "xla").apply({"params": p}, tokens, ALPHAS).logits
        return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, tokens[..., None], -1)[..., 0])
    return jax.vjp(loss, params)


def residual_bytes(vjp_fn) -> int:
    """What the backward pass keeps from the forward: the leaves closed over by the vjp."""
    return sum(leaf.nbytes for leaf in jax.tree.leaves(vjp_fn))


@pytest.mark.parametrize("remat", ["full", "dots", "gelu"])
def test_each_policy_gives_the_gradients_of_none(remat):
    loss, vjp = loss_and_vjp(remat)
    ref_loss, ref_vjp = loss_and_vjp("none")
    (grads,), (ref_grads,) = vjp(jnp.float32(1)), ref_vjp(jnp.float32(1))
    # Remat changes only the backward, but the forward is another program (the blocks under
    # jax.checkpoint): measured bit-equal natively, AVX2, SSE4_2; ~10 float32 ulps allowed.
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        # Recomputation reorders float32 sums: measured max |difference| 4.3e-7 to 4.5e-7 (full)
        # and 3.8e-7 to 4.7e-7 (dots) of the largest gradient (CPU, jax 0.10.2, two versions of
        # the block; the same or less under AVX2 and SSE4_2); a wrong recompute is O(1).
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-6 * float(np.abs(b).max()))


def test_policies_store_less_in_order_none_dots_full_and_gelu_drops_exactly_the_gelu_output():
    saved = {r: residual_bytes(loss_and_vjp(r)[1]) for r in config_lib.REMATS}
    assert saved["none"] > saved["dots"] > saved["full"], saved
    # one [B, T, 4D] float32 GELU output per block: 2 x 12 x 128 x 4 bytes x 3 blocks
    assert saved["none"] - saved["gelu"] == 2 * 12 * 4 * TINY.d_model * 4 * TINY.n_layer, saved


POLICIES = {"none": None, "gelu": None, "full": jax.checkpoint_policies.nothing_saveable,
            "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


@pytest.mark.parametrize("remat", config_lib.REMATS)
def test_the_traced_model_checkpoints_each_block_with_the_policy_of_its_setting(remat):
    """The forward pass's jaxpr: under full and dots one checkpoint (remat) around the whole block
    (its projections and attention: at least 6 matmuls) inside the layer scan, with that policy;
    under none no checkpoint holds a matmul (the kernels' bias + GELU checkpoints only itself)."""
    cfg = dataclasses.replace(TINY, remat=remat)
    tokens = jnp.zeros((2, 12), jnp.int32)
    forward = lambda p: model_lib.Andrea(cfg, "xla").apply({"params": p}, tokens, ALPHAS).logits.sum()
    eqns = list(all_eqns(jax.make_jaxpr(forward)(model_lib.param_shapes(TINY)).jaxpr))  # traced, not run
    matmuls = lambda e: sum(q.primitive.name == "dot_general" for q in all_eqns(e.params["jaxpr"]))
    blocks = [e for e in eqns if e.primitive.name in ("checkpoint", "remat2") and matmuls(e) >= 6]
    if remat in ("none", "gelu"):  # gelu checkpoints GELU and the projection, not the block
        assert blocks == []
        return
    assert len(blocks) == 1, blocks
    assert blocks[0].params["policy"] is POLICIES[remat]
    scans = [e for e in eqns if e.primitive.name == "scan" and e.params["length"] == TINY.n_layer]
    assert any(blocks[0] in list(all_eqns(e.params["jaxpr"].jaxpr)) for e in scans)  # one per layer


def test_old_boolean_settings_mean_full_and_none():
    assert dataclasses.replace(TINY, remat=True).remat == "full"
    assert dataclasses.replace(TINY, remat=False).remat == "none"
    cfg = config_lib.override(config_lib.Config(), ["model.remat=true"])
    assert cfg.model.remat == "full"
    assert config_lib.override(config_lib.Config(), ["model.remat=dots"]).model.remat == "dots"


def test_unknown_policy_is_refused_naming_the_key():
    cfg = config_lib.override(config_lib.Config(), ["model.remat=some"])
    with pytest.raises(config_lib.ConfigError, match=r"^model\.remat: .*none, full, dots, gelu"):
        config_lib.validate(cfg)


def test_gelu_is_refused_for_llama_whose_mlp_has_no_gelu():
    cfg = config_lib.override(config_lib.Config(), ["model.family=llama", "model.remat=gelu", "kernels.impl=xla"])
    with pytest.raises(config_lib.ConfigError, match=r"^model\.remat: gelu recomputes the GPT-2 MLP's GELU output"):
        config_lib.validate(cfg)
