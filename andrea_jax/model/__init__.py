"""The network: layers (attention with its KV cache, MLP, norms, the logical axes of parameters), the
transformer that composes them in the paper's placements, and the ProRes schedules.

`Andrea(cfg).apply(variables, tokens_BT, alphas_L)` is the whole contract; see transformer.py
(the placements, the block and the model), gpt2.py and llama.py (the families: a block's layers
and the model's ends), layers.py (attention, MLP, layout) and prores.py (the schedules).
"""
from andrea_jax.model.transformer import (OUTPUT_PROJECTIONS, PLACEMENTS, Andrea, Block, Output, count_params,
                                          deepnorm_beta, init, init_boxed, param_shapes)
from andrea_jax.model.layers import KVCache, STREAM_BTD, VOCAB_ALIGN, attention_impl, empty_cache, padded_vocab

__all__ = ["OUTPUT_PROJECTIONS", "PLACEMENTS", "Andrea", "Block", "Output", "count_params", "deepnorm_beta", "init",
           "init_boxed", "param_shapes", "KVCache", "STREAM_BTD", "VOCAB_ALIGN",
           "attention_impl", "empty_cache", "padded_vocab"]
