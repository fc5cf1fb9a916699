"""Sampling text from a trained model (no KV cache: a short demo at the end of a run)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from andrea_jax import model as model_lib
from andrea_jax.config import Config
from andrea_jax.data import tokenizer as tokenizer_lib


def sample_tokens(cfg: Config, params, alphas_L, prompt_ids, num_tokens: int, rng,
                  temperature: float = 0.8):
    """Autoregressive sampling in a fixed [1, seq_len] window so that one compilation serves all."""
    model = model_lib.Andrea(cfg.model, cfg.kernels.impl)
    S = cfg.model.seq_len

    @jax.jit
    def next_token(window_S, last, key):
        logits = model.apply({"params": params}, window_S[None], alphas_L)[0, last].astype(jnp.float32)
        return jax.random.categorical(key, logits / temperature)

    ids = list(prompt_ids)
    for key in jax.random.split(rng, num_tokens):
        context = ids[-S:]
        window = jnp.zeros((S,), jnp.int32).at[: len(context)].set(jnp.asarray(context, jnp.int32))
        ids.append(int(next_token(window, len(context) - 1, key)))
    return ids[len(prompt_ids):]


def sample_text(cfg: Config, params, tok, alphas_L, *, prompt: str, num_tokens: int, rng) -> str:
    ids = sample_tokens(cfg, params, alphas_L, tokenizer_lib.encode(tok, prompt), num_tokens, rng)
    return prompt + tokenizer_lib.decode(tok, ids)
