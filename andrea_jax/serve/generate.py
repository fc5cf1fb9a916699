"""Sampling text with a KV cache: one jitted prefill, then one jitted `lax.while_loop` of decode steps.

    andrea-generate (--workdir DIR [--step N] | --export OUT) --prompt TEXT
        [--prompt-file F] [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]

The parameters and alphas are jit arguments (never constants baked into the program), so one
compilation serves every checkpoint of a shape. A batch of prompts of different lengths decodes
together: rows are left-padded, each token's position counts only the row's real tokens, and padded
slots are masked out of attention, so every row gets what it would get alone. Each row stops at
`<|endoftext|>` (or after N tokens); the loop ends when every row has. Sampling is temperature ->
top-k -> top-p; temperature 0 is greedy. Positions are learned up to `model.seq_len`, so prompt plus
new tokens must fit the context: a longer prompt is cut from the left, with a warning.
"""
from __future__ import annotations

if __name__ == "__main__":  # python -m andrea_jax.serve.generate: jax starts as the console scripts start
    from andrea_jax import startup  # it (andrea_jax/commands.py), before the imports below import it
    startup.start_jax()

import argparse
import functools
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from andrea_jax import model as model_lib, signals
from andrea_jax.data import tokenizer as tokenizer_lib


def sample_logits(logits_BV, key, temperature, top_k, top_p):
    """One token per row: greedy at temperature 0, else temperature, then top-k (0 = off), then
    top-p (1 = off) over what is left. All three are traced: changing them never recompiles."""
    logits_BV = logits_BV.astype(jnp.float32)
    greedy_B = jnp.argmax(logits_BV, axis=-1)
    scaled_BV = logits_BV / jnp.maximum(temperature, 1e-6)
    # The sort over the vocabulary is most of a sampled token's cost: done only when a filter is on. Both
    # branches are module functions, not lambdas: jax keeps a cond's traced branches per function, so a call
    # outside jit traces and compiles them once, not at every call.
    filtered_BV = jax.lax.cond((top_k > 0) | (top_p < 1), _top_k_top_p, _unfiltered, scaled_BV, top_k, top_p)
    sampled_B = jax.random.categorical(key, filtered_BV, axis=-1)
    return jnp.where(temperature == 0, greedy_B, sampled_B).astype(jnp.int32)


def _unfiltered(scaled_BV, top_k, top_p):
    return scaled_BV


def _top_k_top_p(scaled_BV, top_k, top_p):
    """The logits outside the top k (0 = all) and then outside the top-p head set to -inf."""
    sorted_BV = jnp.sort(scaled_BV, axis=-1)[:, ::-1]
    V = scaled_BV.shape[-1]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, V), V)
    kth_B1 = jax.lax.dynamic_slice_in_dim(sorted_BV, k - 1, 1, axis=-1)
    sorted_BV = jnp.where(sorted_BV >= kth_B1, sorted_BV, -jnp.inf)
    probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
    # Keep the smallest head of the sorted tokens whose mass reaches top_p (the first always stays).
    keep_BV = (jnp.cumsum(probs_BV, axis=-1) - probs_BV) < top_p
    cutoff_B1 = jnp.min(jnp.where(keep_BV, sorted_BV, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(scaled_BV >= jnp.maximum(cutoff_B1, kth_B1), scaled_BV, -jnp.inf)


@functools.partial(jax.jit, static_argnames=("model",))
def prefill(model, params, alphas_L, tokens_BP, valid_BP):
    """Runs the left-padded prompts through the model, filling slots 0..P-1 of a fresh cache.
    Returns (logits of each row's last token [B, V], cache, valid_BS, next position of each row)."""
    B, P = tokens_BP.shape
    S = model.cfg.seq_len
    positions_BP = jnp.maximum(jnp.cumsum(valid_BP, axis=1) - 1, 0).astype(jnp.int32)
    valid_BS = jnp.zeros((B, S), bool).at[:, :P].set(valid_BP)
    k, v = model_lib.empty_cache(model.cfg, B)
    out = model.apply({"params": params}, tokens_BP, alphas_L,
                      cache=model_lib.KVCache(k, v, jnp.int32(0), positions_BP, valid_BS))
    return out.logits[:, -1], out.kv, valid_BS, valid_BP.sum(axis=1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("model", "stream"))
def decode(model, params, alphas_L, logits_BV, kv, valid_BS, next_pos_B, *, prompt_len, max_new_tokens,
           key, temperature, top_k, top_p, eot_id, stop_at_eot, stream=False):
    """Samples up to max_new_tokens per row, feeding each token back through the cache at slot
    prompt_len + i (both traced: a new N or prompt length never recompiles this loop). Returns
    (tokens [B, S], number generated): the first n columns are the new tokens. A row that has
    produced EOT (with stop_at_eot) keeps emitting EOT while the others go on."""
    B, S = valid_BS.shape
    P = prompt_len
    out_BN = jnp.full((B, S), eot_id, jnp.int32)
    limit = jnp.minimum(max_new_tokens, S - P)

    def cond(carry):
        i, done_B = carry[0], carry[6]
        return (i < limit) & ~jnp.all(done_B)

    def body(carry):
        i, logits_BV, kv, valid_BS, pos_B, out_BN, done_B, key = carry
        key, sub = jax.random.split(key)
        token_B = sample_logits(logits_BV, sub, temperature, top_k, top_p)
        token_B = jnp.where(done_B, eot_id, token_B)
        out_BN = out_BN.at[:, i].set(token_B)
        if stream:
            jax.debug.callback(_stream_callback, token_B, ordered=True)
        done_B = done_B | (stop_at_eot & (token_B == eot_id))

        def step(args):
            kv, valid_BS, pos_B = args
            valid_BS = valid_BS.at[:, P + i].set(True)
            cache = model_lib.KVCache(*kv, P + i, pos_B[:, None], valid_BS)
            out = model.apply({"params": params}, token_B[:, None], alphas_L, cache=cache)
            return out.logits[:, 0].astype(logits_BV.dtype), out.kv, valid_BS, pos_B + 1

        more = (i + 1 < limit) & ~jnp.all(done_B)  # the last token needs no forward pass of its own
        logits_BV, kv, valid_BS, pos_B = jax.lax.cond(
            more, step, lambda args: (logits_BV, *args), (kv, valid_BS, pos_B))
        return i + 1, logits_BV, kv, valid_BS, pos_B, out_BN, done_B, key

    carry = (jnp.int32(0), logits_BV, kv, valid_BS, next_pos_B, out_BN, jnp.zeros((B,), bool), key)
    carry = jax.lax.while_loop(cond, body, carry)
    return carry[5], carry[0]


_STREAM = {"fn": None}


def _stream_callback(token_B):
    if _STREAM["fn"] is not None:
        _STREAM["fn"](int(np.asarray(token_B)[0]))


def fit_prompts(prompts, max_new_tokens: int, seq_len: int, eot_id: int):
    """Prompts cut from the left so that prompt + max_new_tokens fits seq_len (warned), empty
    prompts replaced by EOT (a document start); max_new_tokens capped at seq_len - 1 (warned)."""
    if max_new_tokens > seq_len - 1:
        warnings.warn(f"max_new_tokens={max_new_tokens} does not fit the context of {seq_len} tokens "
                      f"with a prompt; generating at most {seq_len - 1}", stacklevel=3)
        max_new_tokens = seq_len - 1
    budget = seq_len - max_new_tokens
    fitted = []
    for ids in prompts:
        ids = list(ids) or [eot_id]
        if len(ids) > budget:
            warnings.warn(f"a prompt of {len(ids)} tokens with {max_new_tokens} new tokens does not fit "
                          f"the context of {seq_len}: keeping its last {budget} tokens", stacklevel=3)
            ids = ids[-budget:]
        fitted.append(ids)
    return fitted, max_new_tokens


def generate(loaded, prompts, *, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, stop_at_eot: bool = True, on_token=None,
             impl: str | None = None) -> list[list[int]]:
    """New token ids for each prompt (lists of ids), decoded together; a row stops before its EOT
    when stop_at_eot. `loaded` is an andrea_jax.serve.load.LoadedModel. `on_token(id)` is called
    with each new token of the first row as it is produced (streaming; for a single prompt)."""
    cfg = loaded.cfg.model
    eot = tokenizer_lib.eot_id(loaded.tokenizer)
    fitted, max_new_tokens = fit_prompts(prompts, max_new_tokens, cfg.seq_len, eot)
    if max_new_tokens <= 0 or not fitted:
        return [[] for _ in prompts]
    P = max(len(ids) for ids in fitted)
    tokens_BP = np.full((len(fitted), P), eot, np.int32)
    valid_BP = np.zeros((len(fitted), P), bool)
    for row, ids in enumerate(fitted):  # left padding: every row's last prompt token sits at slot P-1
        tokens_BP[row, P - len(ids):] = ids
        valid_BP[row, P - len(ids):] = True
    model = loaded.model(impl)
    alphas_L = loaded.alphas()
    logits_BV, kv, valid_BS, next_pos_B = prefill(model, loaded.params, alphas_L, jnp.asarray(tokens_BP),
                                                  jnp.asarray(valid_BP))
    _STREAM["fn"] = on_token
    try:
        out_BN, n = decode(model, loaded.params, alphas_L, logits_BV, kv, valid_BS, next_pos_B,
                           prompt_len=jnp.int32(P), max_new_tokens=jnp.int32(max_new_tokens), key=jax.random.key(seed),
                           temperature=jnp.float32(temperature), top_k=jnp.int32(top_k),
                           top_p=jnp.float32(top_p), eot_id=jnp.int32(eot),
                           stop_at_eot=jnp.bool_(stop_at_eot), stream=on_token is not None)
        out_BN = np.asarray(out_BN)[:, : int(n)]
        jax.effects_barrier()
    finally:
        _STREAM["fn"] = None
    results = []
    for row in out_BN.tolist():
        if stop_at_eot and eot in row:
            row = row[: row.index(eot)]
        results.append(row)
    return results


class _TextStream:
    """Prints a row's text as its tokens arrive; holds back an incomplete UTF-8 character."""

    def __init__(self, tokenizer, out=sys.stdout):
        self.tokenizer, self.out, self.ids, self.shown = tokenizer, out, [], 0

    def __call__(self, token_id: int) -> None:
        if token_id == tokenizer_lib.eot_id(self.tokenizer):
            return
        self.ids.append(token_id)
        text = tokenizer_lib.decode(self.tokenizer, self.ids)
        if text.endswith("\ufffd"):
            return
        self.out.write(text[self.shown:])
        self.out.flush()
        self.shown = len(text)


def closing_sample(cfg, run_dir, state, tokenizer, *, has_checkpoint: bool) -> None:
    """Prints, on process 0, text sampled from a run that just finished (train.sample_tokens of it):
    from its final checkpoint where there is one, so the sample is what export and generate will
    give, else from the parameters in memory. A multi-process run gathers the parameters on every
    process (each must join the gather) rather than have process 0 read a checkpoint alone."""
    from andrea_jax.serve import load

    if not cfg.train.sample_tokens:
        return
    params = None  # None: read the final checkpoint
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        params = multihost_utils.process_allgather(state.params, tiled=True)
    elif not has_checkpoint:
        params = state.params
    if jax.process_index() != 0:
        return
    if params is None:
        loaded = load.load(workdir=run_dir.root)
    else:
        loaded = load.LoadedModel(cfg, params, tokenizer, int(state.step), str(run_dir.root))
    prompt = "\n"
    new = generate(loaded, [tokenizer_lib.encode(tokenizer, prompt)], max_new_tokens=cfg.train.sample_tokens,
                   temperature=0.8, seed=cfg.train.seed)[0]
    print("--- sample ---\n" + prompt + tokenizer_lib.decode(tokenizer, new) + "\n--------------", flush=True)


def file_prompts(text: str) -> list[str]:
    """The prompts of a --prompt-file's text: one per line that is not blank, `\\n` standing for a newline."""
    return [line.replace("\\n", "\n") for line in text.split("\n") if line.strip()]


@signals.command  # a second SIGINT or SIGTERM stops the process at once, whatever it is doing
def main(argv=None) -> int:
    from andrea_jax.serve import load

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    load.add_source_args(parser)
    parser.add_argument("--prompt", action="append", default=[], help="a prompt; repeat for a batch")
    parser.add_argument("--prompt-file", help="a file of prompts, one per line (\\n escapes a newline)")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = all)")
    parser.add_argument("--top-p", type=float, default=1.0, help="keep the smallest set of mass p (1 = all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    prompts = list(args.prompt)
    if args.prompt_file:
        try:
            with open(args.prompt_file, encoding="utf-8") as f:
                prompts += file_prompts(f.read())
        except OSError as e:
            print(f"error: --prompt-file {args.prompt_file}: {e.strerror}", file=sys.stderr)
            return 1
    if not prompts:
        parser.error("give --prompt TEXT or --prompt-file F")
    for name, ok in (("--max-new-tokens", args.max_new_tokens > 0), ("--temperature", args.temperature >= 0),
                     ("--top-k", args.top_k >= 0), ("--top-p", 0 < args.top_p <= 1)):
        if not ok:
            parser.error(f"{name} is out of range")
    try:
        loaded = load.load_from_args(args)
    except load.LoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    tok = loaded.tokenizer
    encoded = [tokenizer_lib.encode(tok, p) for p in prompts]
    kwargs = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                  top_p=args.top_p, seed=args.seed)
    with warnings.catch_warnings():
        warnings.filterwarnings("always")
        # showwarning, unlike formatwarning, is restored when the block ends: nothing leaks
        warnings.showwarning = lambda message, *a, **k: print(f"warning: {message}", file=sys.stderr)
        if len(prompts) == 1:
            sys.stdout.write(prompts[0])
            generate(loaded, encoded, on_token=_TextStream(tok), **kwargs)
            sys.stdout.write("\n")
        else:
            for prompt, new in zip(prompts, generate(loaded, encoded, **kwargs)):
                print(f"--- {prompt!r}\n{prompt}{tokenizer_lib.decode(tok, new)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
