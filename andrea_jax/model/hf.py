"""The model's parameters as flat named tensors, and Hugging Face weights read into them.

`flatten_params` names every parameter by its flax path joined by '/' (the native export's
names); `read_params` starts a run from Hugging Face weights (`train.init_from=DIR`): the inverse
of `export --format hf`, for any transformers GPT-2 folder (model.family=gpt2) or Llama folder
(model.family=llama) whose shapes fit the config: `config.json` and `model.safetensors`.

GPT-2: Conv1D weights are [in, out], our kernels' layout; wte is the tied embedding (an lm_head
tensor, if saved, must equal it); the buffers old checkpoints carry (`attn.bias`,
`attn.masked_bias`) are not weights and are ignored. Llama: q_proj, k_proj, v_proj are
transposed and concatenated into the fused [q | k | v] kernel, every Linear transposed from
torch's [out, in]; RoPE needs no permutation (model/llama.py). The architecture must be one our
model computes: the GPT-2 family's tanh GELU (`gelu_new`), Llama without grouped-query
attention, biases or a tied head, at rope_theta 10000, and the same norm epsilon; blocks are
pre-norm without gates or QK-norm (what the export writes). A mismatch is one line naming it.

The weights are the blocks' unscaled branches: what ProRes does with them is the run's schedule
(docs/EVALUATION.md, "Continue from Hugging Face weights").
"""
from __future__ import annotations

import json
import pathlib

import jax
import numpy as np

from andrea_jax import model as model_lib
from andrea_jax.config import Config
from andrea_jax.errors import LoadError
from andrea_jax.model.llama import ROPE_THETA

WEIGHTS, CONFIG = "model.safetensors", "config.json"
GPT2_BUFFERS = ("attn.bias", "attn.masked_bias")

# The one table of names for both directions (read here, written by andrea_jax.serve.export):
# our flat names -> Hugging Face's, outside the blocks and, under BLOCK + index, inside them.
GPT2_BLOCK = "transformer.h."
GPT2_NAMES = {"tok_embedding": "transformer.wte.weight", "pos_embedding": "transformer.wpe.weight",
              "lnf_scale": "transformer.ln_f.weight", "lnf_bias": "transformer.ln_f.bias"}
GPT2_BLOCK_NAMES = {  # Conv1D weights are [in, out], our kernels' layout
    "ln1_scale": "ln_1.weight", "ln1_bias": "ln_1.bias", "attn_qkv_kernel": "attn.c_attn.weight",
    "attn_qkv_bias": "attn.c_attn.bias", "attn_out_kernel": "attn.c_proj.weight", "attn_out_bias": "attn.c_proj.bias",
    "ln2_scale": "ln_2.weight", "ln2_bias": "ln_2.bias", "mlp_fc_kernel": "mlp.c_fc.weight",
    "mlp_fc_bias": "mlp.c_fc.bias", "mlp_proj_kernel": "mlp.c_proj.weight", "mlp_proj_bias": "mlp.c_proj.bias"}
LLAMA_BLOCK = "model.layers."
LLAMA_NAMES = {"tok_embedding": "model.embed_tokens.weight", "lnf_scale": "model.norm.weight"}
LLAMA_HEAD = "lm_head.weight"  # our lm_head_kernel, transposed
# Every Linear is torch's [out, in], the transpose of our kernel; the norms are not transposed.
# Our fused attn_qkv_kernel is [q | k | v], the columns of the three projections.
LLAMA_BLOCK_NAMES = {
    "ln1_scale": "input_layernorm.weight",
    "attn_qkv_kernel": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "attn_out_kernel": "self_attn.o_proj.weight",
    "ln2_scale": "post_attention_layernorm.weight", "mlp_gate_kernel": "mlp.gate_proj.weight",
    "mlp_up_kernel": "mlp.up_proj.weight", "mlp_proj_kernel": "mlp.down_proj.weight"}
LLAMA_NORMS = frozenset({"ln1_scale", "ln2_scale"})


def flatten_params(params) -> dict[str, np.ndarray]:
    """{'blocks/attn_qkv_kernel': array, ...}: flax paths joined by '/', as host float32 arrays."""
    flat = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        flat["/".join(k.key for k in path)] = np.asarray(jax.device_get(leaf))
    return flat


def unflatten_params(flat: dict[str, np.ndarray]) -> dict:
    tree: dict = {}
    for name, value in flat.items():
        node = tree
        *parents, leaf = name.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


def _fail(folder, why: str):
    raise LoadError(f"train.init_from={folder}: {why}")


def _require(folder, hf: dict, key: str, want, ours: str) -> None:
    if key in hf and hf[key] != want:
        _fail(folder, f"its config.json has {key}={hf[key]!r}, the model has {ours}")


def _check_architecture(folder, hf: dict, cfg: Config) -> None:
    m = cfg.model
    if m.norm != "pre" or m.gates != "none" or m.qk_norm:
        _fail(folder, f"Hugging Face {m.family} blocks are pre-norm without gates or QK-norm; the config has "
                      f"model.norm={m.norm}, model.gates={m.gates}, model.qk_norm={m.qk_norm}")
    model_type = {"gpt2": "gpt2", "llama": "llama"}[m.family]
    if hf.get("model_type") != model_type:
        _fail(folder, f"model_type {hf.get('model_type')!r} is not {model_type!r}, the architecture of "
                      f"model.family={m.family}")
    if m.family == "gpt2":
        _require(folder, hf, "activation_function", "gelu_new", "tanh GELU (gelu_new)")
        _require(folder, hf, "layer_norm_epsilon", m.ln_eps, f"model.ln_eps={m.ln_eps}")
        _require(folder, hf, "scale_attn_by_inverse_layer_idx", False, "attention scaled by 1/sqrt(K) only")
    else:
        _require(folder, hf, "num_key_value_heads", m.n_head, f"model.n_head={m.n_head} key-value heads")
        _require(folder, hf, "rms_norm_eps", m.ln_eps, f"model.ln_eps={m.ln_eps}")
        _require(folder, hf, "rope_theta", ROPE_THETA, f"RoPE theta {ROPE_THETA:g}")
        _require(folder, hf, "hidden_act", "silu", "SwiGLU (silu)")
        for key in ("attention_bias", "mlp_bias", "tie_word_embeddings"):
            _require(folder, hf, key, False, "none")


def _gpt2_flat(tensors: dict, L: int) -> dict[str, np.ndarray]:
    """Our flat parameter names (flatten_params) from GPT-2's tensors."""
    t = lambda name: tensors.pop(name)
    flat = {ours: t(theirs) for ours, theirs in GPT2_NAMES.items()}
    for name, theirs in GPT2_BLOCK_NAMES.items():
        flat[f"blocks/{name}"] = np.stack([t(f"{GPT2_BLOCK}{i}.{theirs}") for i in range(L)])
    for i in range(L):
        for buffer in GPT2_BUFFERS:
            tensors.pop(f"{GPT2_BLOCK}{i}.{buffer}", None)
    head = tensors.pop("lm_head.weight", None)
    if head is not None and not np.array_equal(head, flat["tok_embedding"]):
        raise ValueError("lm_head.weight differs from transformer.wte.weight (GPT-2's head is tied)")
    return flat


def _llama_flat(tensors: dict, L: int) -> dict[str, np.ndarray]:
    t = lambda name: tensors.pop(name)
    flat = {ours: t(theirs) for ours, theirs in LLAMA_NAMES.items()} | {"lm_head_kernel": t(LLAMA_HEAD).T}
    layer = lambda i, name: t(f"{LLAMA_BLOCK}{i}.{name}")

    def read(i, name, theirs):
        if isinstance(theirs, tuple):  # q, k, v: concatenated into our fused kernel
            return np.concatenate([layer(i, x).T for x in theirs], axis=1)
        return layer(i, theirs) if name in LLAMA_NORMS else layer(i, theirs).T

    rows = {name: [read(i, name, theirs) for i in range(L)] for name, theirs in LLAMA_BLOCK_NAMES.items()}
    for i in range(L):
        tensors.pop(f"{LLAMA_BLOCK}{i}.self_attn.rotary_emb.inv_freq", None)  # a buffer of old checkpoints
    return flat | {f"blocks/{name}": np.stack(v) for name, v in rows.items()}


def read_params(cfg: Config, folder) -> dict:
    """The params tree (numpy float32) of a Hugging Face GPT-2 / Llama folder, checked against
    the shapes of cfg.model; raises LoadError naming the first thing that does not fit."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    folder = pathlib.Path(folder)
    for name in (CONFIG, WEIGHTS):
        if not (folder / name).is_file():
            _fail(folder, f"{folder / name} does not exist (a transformers folder holds {CONFIG} and {WEIGHTS})")
    try:
        hf = json.loads((folder / CONFIG).read_text())
        tensors = load_file(str(folder / WEIGHTS))
    except (OSError, ValueError, SafetensorError) as e:
        _fail(folder, f"cannot be read ({e})")
    _check_architecture(folder, hf, cfg)
    L = cfg.model.n_layer
    try:
        flat = (_gpt2_flat if cfg.model.family == "gpt2" else _llama_flat)(tensors, L)
    except KeyError as e:
        _fail(folder, f"{WEIGHTS} has no tensor {e.args[0]} (it needs model.n_layer={L} blocks of "
                      f"model.family={cfg.model.family})")
    except ValueError as e:
        _fail(folder, str(e))
    if tensors:
        _fail(folder, f"{WEIGHTS} has tensors the model has no place for: {', '.join(sorted(tensors)[:4])}"
                      + (" ..." if len(tensors) > 4 else "") + f" (more than model.n_layer={L} blocks?)")
    expected = {"/".join(k.key for k in p): s for p, s in
                jax.tree_util.tree_flatten_with_path(model_lib.param_shapes(cfg.model))[0]}
    for name, shape in expected.items():
        if flat[name].shape != shape.shape:
            _fail(folder, f"{name} is {list(flat[name].shape)} there, {list(shape.shape)} in the model of the "
                          f"config (model.vocab_size={cfg.model.vocab_size}, seq_len={cfg.model.seq_len}, "
                          f"d_model={cfg.model.d_model}, mlp_ratio={cfg.model.mlp_ratio})")
    return unflatten_params({name: np.asarray(flat[name], np.float32) for name in expected})
