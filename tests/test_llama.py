"""model.family=llama (the official ProRes code's Llama block) against independent references: the
config's refusals, the parameter count by formula, the decay mask, every placement against the
written-out formulas (tests/_ref_blocks.py), remat, KV-cache decoding with left padding, training
through the real train step, the Hugging Face Llama export in transformers, and the sharded step."""
import dataclasses
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from andrea_jax import config as config_lib, configs, model as model_lib
from andrea_jax.config import NORMS, ConfigError, ModelConfig, OptimConfig
from andrea_jax.data import tokenizer as tokenizer_lib
from andrea_jax.model import hf, prores
from andrea_jax.serve import export, generate as gen, load
from andrea_jax.train import optim, steps

import _ref_blocks as ref
from _devices import cpu_devices_env
from _helpers import cached_logits, forward_logits
from test_generate import perturbed_params

ROOT = pathlib.Path(__file__).resolve().parent.parent
SMALL = ModelConfig(vocab_size=300, seq_len=24, d_model=32, n_layer=3, n_head=4, family="llama")
ALPHAS = jnp.array([0.9, 0.45, 0.2], jnp.float32)  # mid-warmup: every block partly on


def jitted(cfg):
    """apply(params, tokens, alphas, cache=None) -> logits, compiled once per shape."""
    model = model_lib.Andrea(cfg)
    return jax.jit(lambda params, tokens, alphas, cache=None:
                   model.apply({"params": params}, tokens, alphas, cache=cache))


def tiny(*overrides):
    return config_lib.validate(config_lib.override(configs.load("tiny"), ["model.family=llama", *overrides]))


# --- config ---------------------------------------------------------------------------------------

def test_shipped_configs_stay_gpt2_and_the_family_is_validated():
    for name in ("tiny", "andrea_120m", "depth:family=tiny,layers=24", "depth:family=71m,layers=96"):
        assert configs.load(name).model.family == "gpt2", name
    with pytest.raises(ConfigError, match=r"^model\.family: unknown model family 'mamba'; known: gpt2, llama$"):
        config_lib.validate(config_lib.override(configs.load("tiny"), ["model.family=mamba"]))
    with pytest.raises(ConfigError, match=r"^model\.family: .*head dim 3 .* must be even"):
        tiny("model.d_model=12", "model.n_head=4")
    for impl in ("pallas", "triton"):  # refused before anything compiles, naming both settings
        with pytest.raises(ConfigError, match=rf"^kernels\.impl: {impl} .*model\.family=llama") as err:
            tiny(f"kernels.impl={impl}")
        assert "\n" not in str(err.value)
    assert tiny("kernels.impl=xla").kernels.impl == "xla"
    config_lib.validate(config_lib.override(configs.load("tiny"), ["kernels.impl=pallas"]))  # gpt2 keeps them


# --- parameters and weight decay ----------------------------------------------------------------

@pytest.mark.parametrize("overrides,n_norms,gate", [((), 2, 0), (("model.norm=sandwich", "model.gates=learned"), 4, 1)])
def test_parameter_count_equals_the_formula(overrides, n_norms, gate):
    m = tiny(*overrides).model
    V, D, L, F = m.vocab_size, m.d_model, m.n_layer, m.mlp_ratio * m.d_model
    # per block: q, k, v, o (4 D^2, no biases), gate, up, down (3 D F), RMSNorm gains, the gate;
    # token embedding, untied head, final RMSNorm gain; no position table.
    formula = L * (4 * D * D + 3 * D * F + n_norms * D + gate) + V * D + D * V + D
    assert model_lib.count_params(m) == formula
    gpt2 = dataclasses.replace(m, family="gpt2")
    print(f"tiny {overrides}: llama {formula:,} parameters, gpt2 {model_lib.count_params(gpt2):,}")
    shapes = model_lib.param_shapes(m)
    assert "pos_embedding" not in shapes and not any(k.endswith("bias") for k in shapes["blocks"])
    assert shapes["lm_head_kernel"].shape == (D, V) and shapes["blocks"]["mlp_gate_kernel"].shape == (L, D, F)


def test_init_scales_embedding_by_sqrt_d_and_head_by_init_std():
    m = dataclasses.replace(SMALL, d_model=64)
    params = jax.jit(lambda key: model_lib.init(m, key))(jax.random.key(0))["params"]
    # A sample std of n = 19,200 normals has relative standard error 1 / sqrt(2n) = 0.5%: 0.02 is 4
    # of them (measured 0.02-1.0% over seeds 0-2); a missing sqrt(d) would be off by 8x.
    np.testing.assert_allclose(np.std(params["tok_embedding"]), 0.02 * np.sqrt(m.d_model), rtol=0.02)
    np.testing.assert_allclose(np.std(params["lm_head_kernel"]), 0.02, rtol=0.02)
    assert np.all(params["lnf_scale"] == 1) and np.all(params["blocks"]["ln1_scale"] == 1)


def test_decay_mask_is_the_linears_the_head_and_the_final_norm():
    m = dataclasses.replace(SMALL, norm="sandwich", gates="learned")
    params = model_lib.init(m, jax.random.key(0))["params"]
    decayed = {jax.tree_util.keystr(p) for p, d in
               jax.tree_util.tree_leaves_with_path(optim.decay_mask(params, "llama")) if d}
    assert decayed == {"['blocks']['attn_qkv_kernel']", "['blocks']['attn_out_kernel']",
                       "['blocks']['mlp_gate_kernel']", "['blocks']['mlp_up_kernel']",
                       "['blocks']['mlp_proj_kernel']", "['lm_head_kernel']", "['lnf_scale']"}
    # The optimizer the train step builds applies it: with a zero gradient AdamW's update is the
    # decay alone, -lr * weight_decay * param on exactly those leaves.
    cfg = OptimConfig(lr=0.5, warmup_steps=0, weight_decay=0.1)
    tx = optim.make(cfg, 10, "llama")
    # in numpy (float32): op by op, jnp would compile its operations for every leaf's shape
    params = jax.tree.map(lambda p: p + np.float32(1.0), jax.device_get(params))
    updates, _ = jax.jit(lambda p: tx.update(jax.tree.map(jnp.zeros_like, p), tx.init(p), p))(params)
    for path, u in jax.tree_util.tree_leaves_with_path(updates):
        p = params
        for k in path:
            p = p[k.key]
        want = np.float32(-0.5 * 0.1) * p if jax.tree_util.keystr(path) in decayed else np.zeros_like(p)
        np.testing.assert_allclose(u, want, rtol=1e-6, err_msg=jax.tree_util.keystr(path))  # measured exact
    assert steps._tx_and_model(tiny())[0] is not steps._tx_and_model(configs.load("tiny"))[0]


# --- the forward pass -----------------------------------------------------------------------------

@pytest.mark.parametrize("norm", NORMS)
def test_every_placement_equals_the_written_out_formulas(norm):
    cfg = dataclasses.replace(SMALL, norm=norm, init="deepnorm" if norm == "deepnorm" else "normal")
    params = perturbed_params(cfg)
    tokens = jax.random.randint(jax.random.key(3), (2, 12), 0, cfg.vocab_size)
    got = forward_logits(model_lib.Andrea(cfg), params, tokens, ALPHAS)
    reference = jax.jit(ref.forward, static_argnums=(0, 4), static_argnames="family")
    want, _ = reference(norm, params, tokens, ALPHAS, cfg.n_head, family="llama")
    # float32 rounding (measured, both jitted: 1.2e-5 deepnorm, 8.6e-6 post, below 4e-6 the others, on
    # logits up to 7.5, natively and under AVX2); a wrong RoPE pairing, a missing gain or alpha moves them by O(1)
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-5)
    shuffled, _ = reference(norm, params, tokens, ALPHAS[::-1], cfg.n_head, family="llama")
    assert np.abs(np.asarray(shuffled) - np.asarray(want)).max() > 0.01


def test_positions_enter_only_through_rope_as_relative_offsets():
    """No position table: RoPE makes attention a function of position differences, so shifting
    every position by the same offset (through the cache's positions_BT) changes nothing, while
    moving one position does."""
    params, apply = perturbed_params(SMALL), jitted(SMALL)
    tokens = jax.random.randint(jax.random.key(4), (2, 10), 0, SMALL.vocab_size)

    def at(positions_T):
        k, v = model_lib.empty_cache(SMALL, 2)
        valid = jnp.zeros((2, SMALL.seq_len), bool).at[:, :10].set(True)
        cache = model_lib.KVCache(k, v, 0, jnp.broadcast_to(jnp.asarray(positions_T, jnp.int32), (2, 10)), valid)
        return np.asarray(apply(params, tokens, ALPHAS, cache).logits)

    base = np.asarray(apply(params, tokens, ALPHAS).logits)
    # float32 cos / sin of other angles: measured 4.8e-6 on logits of order 1
    np.testing.assert_allclose(at(np.arange(10) + 13), base, rtol=0, atol=2e-5)
    moved = at(np.r_[np.arange(9), 12])
    np.testing.assert_allclose(moved[:, :9], base[:, :9], rtol=0, atol=2e-5)  # causal: the past is unmoved
    assert np.abs(moved[:, 9] - base[:, 9]).max() > 0.01


def test_remat_changes_nothing():
    params = perturbed_params(SMALL)
    tokens = jax.random.randint(jax.random.key(5), (2, 12), 0, SMALL.vocab_size)

    def value_and_grad(cfg):
        loss = lambda p: model_lib.Andrea(cfg).apply({"params": p}, tokens, ALPHAS).logits.sum()
        return jax.jit(jax.value_and_grad(loss))(params)

    want, want_grads = value_and_grad(SMALL)
    for remat in ("full", "dots"):
        got, grads = value_and_grad(dataclasses.replace(SMALL, remat=remat))
        np.testing.assert_allclose(got, want, rtol=1e-6)
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * float(np.abs(b).max()))  # as tests/test_model.py


# --- decoding -------------------------------------------------------------------------------------

@pytest.mark.parametrize("norm,gates", [("pre", "learned"), ("post", "none"), ("lns", "none")])
def test_cached_decoding_equals_full_forward_at_every_position(norm, gates):
    cfg = dataclasses.replace(SMALL, norm=norm, gates=gates)
    apply, params = jitted(cfg), perturbed_params(cfg)
    tokens = jax.random.randint(jax.random.key(7), (2, 14), 0, cfg.vocab_size)
    full = apply(params, tokens, ALPHAS).logits
    cached = cached_logits(cfg, apply, params, tokens, ALPHAS, prefill_len=5)
    np.testing.assert_allclose(cached, full, rtol=0, atol=2e-5)  # as tests/test_generate.py
    assert not np.allclose(cached_logits(cfg, apply, params, tokens, jnp.ones(3), 5), full, atol=1e-3)


def test_left_padded_rows_equal_their_unpadded_prompts_at_every_step():
    """Left-padded rows (garbage in the pad slots), a prefill and then a token at a time: each real
    position's logits equal the row run alone from position 0 with no cache, which holds only if
    RoPE reads the cache's positions_BT (a row's slot index is not its position)."""
    params, apply = perturbed_params(SMALL), jitted(SMALL)
    rng = np.random.default_rng(0)
    lengths, P, n_steps = [9, 5, 1], 9, 6
    seqs = [rng.integers(1, SMALL.vocab_size, n + n_steps) for n in lengths]
    B = len(lengths)
    tokens_BP = rng.integers(1, SMALL.vocab_size, (B, P)).astype(np.int32)
    valid_BP = np.zeros((B, P), bool)
    for r, n in enumerate(lengths):
        tokens_BP[r, P - n:], valid_BP[r, P - n:] = seqs[r][:n], True
    positions_BP = np.maximum(np.cumsum(valid_BP, axis=1) - 1, 0).astype(np.int32)

    def decode(position_of):  # position_of(r, i): the position fed with row r's i-th decoded token
        valid_BS = np.zeros((B, SMALL.seq_len), bool)
        valid_BS[:, :P] = valid_BP
        k, v = model_lib.empty_cache(SMALL, B)
        logits, _, (k, v) = apply(params, tokens_BP, ALPHAS, model_lib.KVCache(k, v, 0, positions_BP, valid_BS.copy()))
        out = [np.asarray(logits)]
        for i in range(n_steps):
            valid_BS[:, P + i] = True
            fed_B1 = np.array([[seq[n + i]] for seq, n in zip(seqs, lengths)], np.int32)
            pos_B1 = np.array([[position_of(r, i)] for r in range(B)], np.int32)
            cache = model_lib.KVCache(k, v, np.int32(P + i), pos_B1, valid_BS.copy())
            logits, _, (k, v) = apply(params, fed_B1, ALPHAS, cache)
            out.append(np.asarray(logits))
        return np.concatenate(out, axis=1)

    cached = decode(lambda r, i: lengths[r] + i)
    # Each row alone from position 0, no cache, in one batch: right-padded (causal, so unseen).
    alone_BT = rng.integers(1, SMALL.vocab_size, (B, P + n_steps)).astype(np.int32)
    for r, seq in enumerate(seqs):
        alone_BT[r, :len(seq)] = seq
    alone = np.asarray(apply(params, alone_BT, ALPHAS).logits)
    for r, n in enumerate(lengths):
        np.testing.assert_allclose(cached[r, P - n:], alone[r, :n + n_steps], rtol=0, atol=2e-5, err_msg=f"row {r}")
    # RoPE is relative, so what matters is that the decoded tokens' positions continue the
    # prefill's: the slot index instead (a cache ignoring positions_BT) moves the padded rows only.
    slots = decode(lambda r, i: P + i)
    np.testing.assert_allclose(slots[0], cached[0], rtol=0, atol=1e-6)  # row 0 is unpadded: slot = position
    for r in (1, 2):
        assert np.abs(slots[r, P:] - cached[r, P:]).max() > 0.01, r


# --- training -------------------------------------------------------------------------------------

def test_loss_falls_through_the_real_train_step_with_prores_linear():
    cfg = tiny("prores.schedule=linear", "prores.warmup=2", "model.seq_len=32", "train.batch_size=8",
               "optim.warmup_steps=0", "train.steps=12")
    mesh = steps.make_mesh()
    state = steps.create_state(cfg, jax.random.key(0), mesh)
    step = steps.make_train_step(cfg, mesh)
    batch = np.asarray(jax.random.randint(jax.random.key(1), (8, 33), 0, cfg.model.vocab_size), np.int32)
    losses = []
    for _ in range(cfg.train.steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    np.testing.assert_allclose(prores.run_alphas(cfg, state.step), 1.0)  # every block warmed up
    assert losses[0] > 8.0  # about ln(8449) at init: the untied head starts near uniform
    assert losses[-1] < losses[0] - 2.0, losses
    assert int(state.step) == cfg.train.steps and step._cache_size() == 1


# --- the Hugging Face export ----------------------------------------------------------------------

def hf_llama(folder):
    from transformers import LlamaForCausalLM

    model, info = LlamaForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


def random_loaded(tok_path, *overrides, step=6):
    cfg = tiny("model.n_layer=3", "model.d_model=32", "model.n_head=4", "model.seq_len=32", "model.vocab_size=300",
               "prores.schedule=linear", "prores.warmup=4", *overrides)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: (0.3 * rng.standard_normal(s.shape)).astype(np.float32),
                          model_lib.param_shapes(cfg.model))
    return load.LoadedModel(cfg, params, tokenizer_lib.load(tok_path), step, "random")


@pytest.fixture(scope="module")
def llama_run(trained_run):
    """A trained 3-block llama (6 steps, evaluated at the end: alphas [1, 0.75, 0.5]), loaded."""
    return load.load(workdir=trained_run("model.family=llama"))


# trained: the training loop's checkpoint; lns and gates: random parameters of every size (gates
# included), where the folds change the logits by O(1)
HF_CASES = {"trained": None, "lns": ("model.norm=lns",), "gates": ("model.gates=learned",)}


@pytest.mark.parametrize("which", list(HF_CASES))
def test_hf_llama_logits_equal_ours_in_transformers(llama_run, tok_path, tmp_path, which):
    import torch

    loaded = llama_run if which == "trained" else random_loaded(tok_path, *HF_CASES[which])
    folder = export.save_hf(loaded, tmp_path / "hf")
    alphas = hf.folded_alphas(loaded.cfg, loaded.step, hf.flatten_params(loaded.params))
    np.testing.assert_allclose(np.asarray(loaded.alphas()), [1.0, 0.75, 0.5])
    assert not np.allclose(alphas, 1.0)
    meta = json.loads((folder / "config.json").read_text())
    assert meta["model_type"] == "llama" and meta["andrea"]["folded_alphas"] == pytest.approx(alphas)
    tokens = np.array(jax.random.randint(jax.random.key(0), (2, 32), 0, loaded.cfg.model.vocab_size))
    model = loaded.model("xla")
    ours = np.array(model.apply({"params": loaded.params}, jnp.asarray(tokens), loaded.alphas()).logits)
    with torch.no_grad():
        theirs = hf_llama(folder)(torch.from_numpy(tokens).long()).logits.numpy()
    diff = float(np.abs(theirs - ours).max())
    print(f"{which}: max |logit difference| vs transformers Llama = {diff:.3g}")
    assert diff < 1e-4
    unfolded = np.array(model.apply({"params": loaded.params}, jnp.asarray(tokens), jnp.ones(3)).logits)
    assert np.abs(unfolded - ours).max() > 100 * max(diff, 1e-6)


# The 6-step run's next tokens hardly depend on its MLPs (exported with gate and up swapped, it still
# generates the same); random parameters of O(1) effect do, so a mix-up in any projection changes them.
@pytest.mark.parametrize("which", ["trained", "random"])
def test_hf_llama_greedy_generate_equals_ours(llama_run, tok_path, tmp_path, which):
    import torch

    loaded = llama_run if which == "trained" else random_loaded(tok_path)
    folder = export.save_hf(loaded, tmp_path / "hf")
    prompt = loaded.tokenizer.encode("ROMEO: What").ids
    [ours] = gen.generate(loaded, [prompt], max_new_tokens=12, temperature=0.0, stop_at_eot=False)
    out = hf_llama(folder).generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                    do_sample=False, max_new_tokens=12, min_new_tokens=12)
    theirs = out[0, len(prompt):].tolist()
    k = ours.index(0) if 0 in ours else len(ours)  # ours may stop-choose EOT where min_new_tokens forbids it
    print(f"{which}: {k} greedy tokens compared, ours {ours}")
    assert k >= 6 and theirs[:k] == ours[:k], (theirs, ours)


@pytest.mark.parametrize("norm", ["post", "sandwich", "deepnorm"])
def test_hf_llama_refuses_placements_llama_cannot_express(tok_path, tmp_path, norm):
    out = tmp_path / "out"
    with pytest.raises(export.ExportError, match=rf"model.norm={norm} .* Llama: .*pre-norm.*--format native"):
        export.save_hf(random_loaded(tok_path, f"model.norm={norm}"), out)
    assert not out.exists()


# --- sharding -------------------------------------------------------------------------------------

def test_sharding_rules_cover_every_llama_param():
    from andrea_jax.train import sharding

    cfg = dataclasses.replace(tiny(), mesh=config_lib.MeshConfig(data=1, fsdp=1, tensor=1))
    specs = sharding.logical_param_specs(cfg)
    names = {jax.tree_util.keystr(p): tuple(s) for p, s in
             jax.tree_util.tree_leaves_with_path(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))}
    assert names["['blocks']['mlp_gate_kernel']"] == ("layers", "embed", "mlp")
    assert names["['blocks']['mlp_up_kernel']"] == ("layers", "embed", "mlp")
    assert names["['lm_head_kernel']"] == ("embed", "vocab")
    state = steps.abstract_state(cfg, steps.make_mesh(cfg))  # every leaf, Adam's moments included
    assert len(jax.tree.leaves(state.params)) == len(names)


def test_sharded_llama_step_equals_one_device():
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "programs" / "llama_sharded.py")],
                          env=cpu_devices_env(8),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    for shape in ["(2, 2, 2)", "(1, 2, 4)"]:
        assert f"OK llama mesh {shape} == one device" in proc.stdout
    assert "ALL OK llama" in proc.stdout
