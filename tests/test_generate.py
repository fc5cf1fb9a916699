"""KV-cache decoding against the full forward pass: every placement, alphas < 1, left padding,
greedy tokens, sampling filters, EOT, long prompts, the command line."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import _helpers
from _helpers import cached_logits, forward_logits, run_module
from andrea_jax.serve import generate as gen, load
from andrea_jax import model as model_lib
from andrea_jax.config import NORMS, Config, ModelConfig, ProResConfig
from andrea_jax.data import tokenizer as tok_lib

SMALL = ModelConfig(vocab_size=300, seq_len=24, d_model=32, n_layer=3, n_head=4)
ALPHAS = jnp.array([0.9, 0.45, 0.2], jnp.float32)  # mid-warmup: every block partly on


perturbed_params = functools.partial(_helpers.perturbed_params, scale=0.3)


@pytest.mark.parametrize("norm,gates", [(n, "none") for n in NORMS] + [("pre", "learned")])
def test_cached_decoding_equals_full_forward_at_every_position(norm, gates):
    cfg = dataclasses.replace(SMALL, norm=norm, gates=gates)
    model = model_lib.Andrea(cfg)
    params = perturbed_params(cfg)
    tokens = jax.random.randint(jax.random.key(7), (2, 14), 0, cfg.vocab_size)
    full = forward_logits(model, params, tokens, ALPHAS)

    @jax.jit
    def apply(params, tokens_BT, alphas, cache):
        return model.apply({"params": params}, tokens_BT, alphas, cache=cache)

    cached = cached_logits(cfg, apply, params, tokens, ALPHAS, prefill_len=5)
    assert full.shape == cached.shape
    # measured max abs diff, both jitted: 4.0e-6 pre, 4.8e-6 post, 2.9e-6 sandwich, 4.6e-6 deepnorm,
    # 2.9e-6 lns, 2.3e-6 learned gates (the same under --xla_cpu_max_isa=AVX2), on logits up to 8.4:
    # float32 rounding of attention over the masked cache
    np.testing.assert_allclose(cached, full, rtol=0, atol=2e-5)
    # and the alphas matter: the same cache with alphas of 1 gives other logits
    assert not np.allclose(cached_logits(cfg, apply, params, tokens, jnp.ones(3), 5), full, atol=1e-3)


def loaded_model(cfg=SMALL, tok=None, params=None, step=0, schedule="none"):
    full = Config(model=cfg, prores=ProResConfig(schedule=schedule, warmup=4))
    return load.LoadedModel(full, params if params is not None else perturbed_params(cfg),
                                 tok, step, "test")


def greedy_full_recompute(loaded, prompt, n):
    """The reference: re-run the whole sequence for every new token, take the argmax."""
    model, ids = loaded.model(), list(prompt)
    for _ in range(n):
        logits = forward_logits(model, loaded.params, jnp.asarray([ids]), loaded.alphas())
        ids.append(int(jnp.argmax(logits[0, -1])))
    return ids[len(prompt):]


@pytest.fixture(scope="module")
def tok(tok_path):
    return tok_lib.load(tok_path)


def test_greedy_tokens_equal_full_recompute_with_alphas_below_one(tok):
    loaded = loaded_model(tok=tok, step=5, schedule="linear")  # alphas [1, 0.625, 0.417]
    assert float(loaded.alphas().min()) < 1
    prompt = [5, 17, 42, 9]
    got = gen.generate(loaded, [prompt], max_new_tokens=12, temperature=0.0, stop_at_eot=False)[0]
    assert got == greedy_full_recompute(loaded, prompt, 12)


def test_left_padded_batch_equals_each_prompt_alone(tok):
    loaded = loaded_model(tok=tok, step=3, schedule="linear")
    prompts = [[3, 4, 5], [10, 11, 12, 13, 14, 15, 16], [7]]
    batch = gen.generate(loaded, prompts, max_new_tokens=8, temperature=0.0, stop_at_eot=False)
    alone = [gen.generate(loaded, [p], max_new_tokens=8, temperature=0.0, stop_at_eot=False)[0] for p in prompts]
    assert batch == alone
    assert all(len(row) == 8 for row in batch)
    # and the prefill logits of each padded row equal the unpadded forward pass
    tokens = np.full((3, 7), 0, np.int32)
    valid = np.zeros((3, 7), bool)
    for r, p in enumerate(prompts):
        tokens[r, 7 - len(p):], valid[r, 7 - len(p):] = p, True
    last, *_ = gen.prefill(loaded.model(), loaded.params, loaded.alphas(), jnp.asarray(tokens), jnp.asarray(valid))
    for r, p in enumerate(prompts):
        alone_logits = forward_logits(loaded.model(), loaded.params, jnp.asarray([p]), loaded.alphas())[0, -1]
        np.testing.assert_allclose(last[r], alone_logits, rtol=0, atol=2e-5)


def test_left_padded_rows_with_garbage_padding_equal_their_unpadded_prompts_at_every_step():
    """A prefill of left-padded rows whose pad slots hold random tokens, then one token at a time
    through the cache: every real position's logits, prefill and each decoded step, equal the
    same tokens run alone and unpadded, with no cache."""
    model, params = model_lib.Andrea(SMALL), perturbed_params(SMALL)
    rng = np.random.default_rng(0)
    lengths, P, steps = [9, 5, 1], 9, 6           # prompt lengths; the prefill is P slots wide
    seqs = [rng.integers(1, SMALL.vocab_size, n + steps) for n in lengths]  # each prompt + fed tokens
    B = len(lengths)
    tokens_BP = rng.integers(1, SMALL.vocab_size, (B, P)).astype(np.int32)  # garbage in the pad slots
    valid_BP = np.zeros((B, P), bool)
    for r, n in enumerate(lengths):
        tokens_BP[r, P - n:], valid_BP[r, P - n:] = seqs[r][:n], True
    positions_BP = np.maximum(np.cumsum(valid_BP, axis=1) - 1, 0).astype(np.int32)

    apply = jax.jit(lambda tokens, cache: model.apply({"params": params}, tokens, ALPHAS, cache=cache))

    def run(valid_BP):
        valid_BS = np.zeros((B, SMALL.seq_len), bool)
        valid_BS[:, :P] = valid_BP
        k, v = model_lib.empty_cache(SMALL, B)
        logits, _, (k, v) = apply(tokens_BP, model_lib.KVCache(k, v, 0, positions_BP, valid_BS.copy()))
        out = [np.asarray(logits)]
        for i in range(steps):
            valid_BS[:, P + i] = True
            fed_B1 = np.array([[seq[n + i]] for seq, n in zip(seqs, lengths)], np.int32)
            pos_B1 = np.array([[n + i] for n in lengths], np.int32)
            logits, _, (k, v) = apply(fed_B1, model_lib.KVCache(k, v, np.int32(P + i), pos_B1, valid_BS.copy()))
            out.append(np.asarray(logits))
        return np.concatenate(out, axis=1)  # [B, P + steps, V]: slot s's logits

    cached = run(valid_BP)
    # Each row alone, from position 0, no cache, in one batch: right-padded, which a causal model
    # never sees (tests/test_model.py test_causality).
    alone_BT = rng.integers(1, SMALL.vocab_size, (B, P + steps)).astype(np.int32)
    for r, seq in enumerate(seqs):
        alone_BT[r, :len(seq)] = seq
    alone = np.asarray(jax.jit(lambda t: model.apply({"params": params}, t, ALPHAS).logits)(alone_BT))
    for r, n in enumerate(lengths):
        # slots P - n .. P + steps - 1 hold the row's tokens 0 .. n + steps - 1; measured max
        # |difference| 3.3e-6, 2.5e-6, 4.3e-6 (rows 0, 1, 2) on logits up to 8.2 (float32 rounding)
        np.testing.assert_allclose(cached[r, P - n:], alone[r, :n + steps], rtol=0, atol=2e-5, err_msg=f"row {r}")
    # The garbage matters: with its slots marked valid, the padded rows' logits move by 4.5 and 5.3
    # (measured; the unpadded row 0 does not change).
    unmasked = run(np.ones((B, P), bool))
    # exact by construction: the same executables, and row 0's inputs (no padding) are the same
    np.testing.assert_array_equal(unmasked[0], cached[0])
    for r in (1, 2):
        assert np.abs(unmasked[r, P:] - cached[r, P:]).max() > 0.1, r



@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_empty_cache_holds_every_layer_s_keys_and_values_in_the_compute_dtype(dtype):
    k, v = model_lib.empty_cache(dataclasses.replace(SMALL, dtype=dtype), 5)
    for cache in (k, v):   # bf16 compute keeps a bf16 cache: half the memory of a float32 one
        assert cache.shape == (3, 5, 24, 4, 8) and cache.dtype == jnp.dtype(dtype) and not cache.any()


def test_sampling_filters_and_seeds():
    logits = jnp.array([[0.0, 3.0, 2.9, -1.0, 1.0]] * 4)
    keys = jax.random.split(jax.random.key(0), 200)
    draw = lambda t, k, p: np.array([gen.sample_logits(logits, key, t, k, p) for key in keys]).ravel()
    assert set(draw(0.0, 0, 1.0)) == {1}                       # greedy
    assert set(draw(1.0, 1, 1.0)) == {1}                       # top-1 is greedy
    assert set(draw(5.0, 2, 1.0)) == {1, 2}                    # top-2 keeps two tokens
    assert set(draw(1.0, 0, 0.5)) == {1, 2}                    # p(1) ~ 0.46 < 0.5: the head of two
    assert set(draw(1.0, 0, 0.3)) == {1}
    assert len(set(draw(5.0, 0, 1.0))) == 5                    # hot, unfiltered: everything appears
    k = jax.random.key(3)
    assert np.array_equal(gen.sample_logits(logits, k, 1.0, 0, 1.0), gen.sample_logits(logits, k, 1.0, 0, 1.0))
    for key in keys[:20]:  # unfiltered, with the filters off or keeping all 5: a draw from the tempered logits
        want = jax.random.categorical(key, logits / 2.0, axis=-1)
        assert np.array_equal(gen.sample_logits(logits, key, 2.0, 0, 1.0), want)
        assert np.array_equal(gen.sample_logits(logits, key, 2.0, 5, 1.0), want)
    # top-k with top-p off keeps k even where the k probabilities' float32 sum falls short of 1 (these 50
    # logits: it does, and top-p's cut alone would then keep every token)
    wide = 3.0 * jax.random.normal(jax.random.key(0), (1, 50))
    top5 = set(np.argsort(np.asarray(wide[0]))[-5:].tolist())
    assert {int(gen.sample_logits(wide, key, 1.0, 5, 1.0)[0]) for key in keys} <= top5
    # temperature 0 is argmax itself, whose tie goes to the first: never a draw at a tiny temperature
    tied = jnp.array([[0.0, 3.0, 3.0, -1.0]])
    assert {int(gen.sample_logits(tied, key, 0.0, 0, 1.0)[0]) for key in keys} == {1}


def eot_loving_params(cfg, tok):
    """Parameters whose every next-token argmax is <|endoftext|>: LN_f outputs the EOT embedding."""
    params = perturbed_params(cfg)
    eot = tok_lib.eot_id(tok)
    emb = params["tok_embedding"].at[eot].set(jnp.full((cfg.d_model,), 3.0))
    return {**params, "tok_embedding": emb, "lnf_scale": jnp.zeros(cfg.d_model), "lnf_bias": emb[eot]}


def test_decoding_stops_at_end_of_text(tok):
    loaded = loaded_model(tok=tok, params=eot_loving_params(SMALL, tok))
    assert gen.generate(loaded, [[5, 6], [7]], max_new_tokens=6) == [[], []]
    eot = tok_lib.eot_id(tok)
    assert gen.generate(loaded, [[5, 6]], max_new_tokens=6, stop_at_eot=False) == [[eot] * 6]
    seen = []   # the loop itself ends at the EOT: one token streamed, not six
    assert gen.generate(loaded, [[5, 6]], max_new_tokens=6, on_token=seen.append) == [[]] and seen == [eot]


def test_long_prompt_is_cut_from_the_left_with_a_warning(tok):
    loaded = loaded_model(tok=tok)
    long_prompt = list(range(1, 40))  # seq_len is 24
    with pytest.warns(UserWarning, match="keeping its last 19 tokens"):
        got = gen.generate(loaded, [long_prompt], max_new_tokens=5, temperature=0.0, stop_at_eot=False)
    assert got == gen.generate(loaded, [long_prompt[-19:]], max_new_tokens=5, temperature=0.0, stop_at_eot=False)
    with pytest.warns(UserWarning, match="generating at most 23"):
        assert len(gen.generate(loaded, [[1]], max_new_tokens=100, temperature=0.0, stop_at_eot=False)[0]) == 23


def test_streaming_reports_every_token_in_order(tok):
    loaded = loaded_model(tok=tok)
    seen = []
    got = gen.generate(loaded, [[4, 5]], max_new_tokens=7, temperature=0.7, seed=1, on_token=seen.append,
                       stop_at_eot=False)[0]
    assert seen == got and len(got) == 7


def test_generate_cli_streams_from_a_workdir_and_refuses_a_missing_one(trained_run, tmp_path):
    run = trained_run()
    proc = run_module("andrea_jax.serve.generate", "--workdir", run, "--prompt", "ROMEO:", "--max-new-tokens", 8,
                      "--temperature", 0)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = load.load(workdir=run)
    want = gen.generate(loaded, [tok_lib.encode(loaded.tokenizer, "ROMEO:")], max_new_tokens=8)[0]
    assert proc.stdout.startswith("ROMEO:" + tok_lib.decode(loaded.tokenizer, want))
    proc = run_module("andrea_jax.serve.generate", "--workdir", tmp_path / "nope", "--prompt", "x")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"error: {tmp_path / 'nope'}: no such run folder"]


def test_an_empty_prompt_starts_a_document_and_a_context_long_request_is_capped(tok):
    loaded = loaded_model(tok=tok)
    eot = tok_lib.eot_id(tok)
    greedy = dict(max_new_tokens=5, temperature=0.0, stop_at_eot=False)
    assert gen.generate(loaded, [[]], **greedy) == gen.generate(loaded, [[eot]], **greedy)
    with pytest.warns(UserWarning, match="max_new_tokens=24 does not fit the context of 24 tokens"):
        assert len(gen.generate(loaded, [[1]], max_new_tokens=24, temperature=0.0, stop_at_eot=False)[0]) == 23


def test_a_row_that_has_ended_keeps_emitting_end_of_text_while_the_others_go_on(tok, monkeypatch):
    # row 0 samples EOT first, then would sample 9s; row 1 samples 7s. Eagerly (no jit), so that the
    # sampler below is the one the loop calls.
    eot = tok_lib.eot_id(tok)
    calls = []

    def sampler(logits_BV, key, temperature, top_k, top_p):
        calls.append(1)
        return jnp.array([eot if len(calls) == 1 else 9, 7], jnp.int32)
    monkeypatch.setattr(gen, "sample_logits", sampler)
    seen = []
    with jax.disable_jit():
        got = gen.generate(loaded_model(tok=tok), [[5, 6], [7]], max_new_tokens=4, on_token=seen.append)
    assert got == [[], [7, 7, 7, 7]] and seen == [eot] * 4


def test_the_text_stream_prints_whole_characters_and_never_end_of_text(tok):
    import io
    ids = tok_lib.encode(tok, "日本 ok")
    assert len(ids) > 3   # the test tokenizer spells the two characters in bytes: some tokens end mid-character
    out, writes = io.StringIO(), []
    stream = gen._TextStream(tok, out)
    out.write = lambda text, write=out.write: writes.append(text) or write(text)
    for token in ids + [tok_lib.eot_id(tok)]:
        stream(token)
    assert out.getvalue() == "日本 ok" and not any("\ufffd" in w for w in writes)


def test_prompt_file_lines_are_prompts_with_escaped_newlines():
    assert gen.file_prompts("first\\nline\n\n   \nsecond\n") == ["first\nline", "second"]


@pytest.mark.parametrize("flag,value", [("--max-new-tokens", "0"), ("--temperature", "-0.5"), ("--top-k", "-1"),
                                        ("--top-p", "0"), ("--top-p", "1.5")])
def test_the_command_refuses_a_setting_out_of_range_before_loading(flag, value, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        gen.main(["--export", str(tmp_path / "nothing"), "--prompt", "x", flag, value])
    assert exit_.value.code == 2 and f"{flag} is out of range" in capsys.readouterr().err
