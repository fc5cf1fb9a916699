"""Decode speed: the KV-cache sampler (andrea_jax.serve.generate) against the full-recompute sampler it
replaced, on random parameters of a config, one prompt, the same number of new tokens.

    python benchmarks/decode.py --config tiny --new-tokens 100
    python benchmarks/decode.py --config andrea_120m --new-tokens 32

Both sample greedily (temperature 0 gives the argmax in both) after a compile-and-warm-up call, so
the timed calls do the same work: a prompt of --prompt-tokens tokens, then --new-tokens tokens. The
baseline is the sampler of andrea_jax.serve.generate before the KV cache, kept here verbatim apart from
greedy selection: every token re-runs the model over a fixed [1, seq_len] window, compiled once for
all calls with the parameters as arguments (as the KV-cache sampler takes them; the old sampler
compiled anew per call, which timed compilation as decoding). Prints one JSON line per sampler.
"""
from __future__ import annotations

import argparse
import functools
import json
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from andrea_jax import config as config_lib, configs, model as model_lib  # noqa: E402
from andrea_jax.serve import generate, load  # noqa: E402
from andrea_jax.data import tokenizer as tokenizer_lib  # noqa: E402


@functools.partial(jax.jit, static_argnames=("model",))
def _next_token(model, params, alphas_L, window_S, last):
    logits = model.apply({"params": params}, window_S[None], alphas_L).logits[0, last].astype(jnp.float32)
    return jnp.argmax(logits)


def full_recompute_tokens(cfg, params, alphas_L, prompt_ids, num_tokens):
    """The previous sampler: a whole [1, seq_len] window per token. One compilation serves every
    call (defined once, parameters and alphas as arguments, as the KV-cache sampler takes them),
    so the warm-up call leaves only decoding in the timed ones."""
    model = model_lib.Andrea(cfg.model, cfg.kernels.impl)
    S = cfg.model.seq_len
    ids = list(prompt_ids)
    for _ in range(num_tokens):
        context = ids[-S:]
        window = jnp.zeros((S,), jnp.int32).at[: len(context)].set(jnp.asarray(context, jnp.int32))
        ids.append(int(_next_token(model, params, alphas_L, window, len(context) - 1)))
    return ids[len(prompt_ids):]


def timed(fn, repeats):
    fn()  # compile and warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per sampler (median)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args(argv)
    cfg = config_lib.validate(config_lib.override(configs.load(args.config), args.set))
    params = model_lib.init(cfg.model, jax.random.key(0), cfg.kernels.impl)["params"]
    V = cfg.model.vocab_size
    # A stand-in tokenizer: only its EOT id matters here, and stop_at_eot is off for equal work.
    tok = tokenizer_lib.train(["ab ab"], 258)
    loaded = load.LoadedModel(cfg, params, tok, 10 ** 9, "random")  # past the warmup: alphas all 1
    prompt = list(np.random.default_rng(0).integers(1, V, args.prompt_tokens))
    n = args.new_tokens

    cached_s, cached = timed(lambda: generate.generate(loaded, [prompt], max_new_tokens=n, temperature=0.0,
                                                       stop_at_eot=False)[0], args.repeats)
    full_s, full = timed(lambda: full_recompute_tokens(cfg, params, loaded.alphas(), prompt, n), args.repeats)
    agree = sum(a == b for a, b in zip(cached, full))
    base = {"config": args.config, "device": jax.devices()[0].platform, "prompt_tokens": args.prompt_tokens,
            "new_tokens": n, "seq_len": cfg.model.seq_len, "params": model_lib.count_params(cfg.model)}
    for name, seconds in (("kv_cache", cached_s), ("full_recompute", full_s)):
        print(json.dumps({**base, "sampler": name, "seconds": round(seconds, 4),
                          "tokens_per_sec": round(n / seconds, 2)}))
    print(json.dumps({**base, "speedup": round(full_s / cached_s, 2), "greedy_tokens_agree": f"{agree}/{n}"}))


if __name__ == "__main__":
    main()
