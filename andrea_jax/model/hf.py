"""The model's parameters as flat named tensors, and Hugging Face's weights both ways: read into
them and written from them, the ProRes alphas folded in.

`flatten_params` names every parameter by its flax path joined by '/' (the native export's names).
Each family's module holds its Hugging Face architecture (gpt2.py: GPT-2, llama.py: Llama): the
names of its tensors (HF_NAMES outside the blocks, HF_BLOCK_NAMES in them), whether its matrices
are the transpose of our kernels (HF_TRANSPOSED: torch's Linear is [out, in], GPT-2's Conv1D is
[in, out] as ours), its config.json (`hf_config`). A fused kernel of ours named with several of
theirs is their tensors' columns side by side (llama's [q | k | v]). A family whose
HF_ARCHITECTURE is None has no such form: both directions refuse it.

Writing (`export --format hf`, andrea_jax.serve.export): `state_dict` and `config_json` make the
model at one step a transformers model that needs no code of ours. ANDREA is the family's model
plus a ProRes alpha per block, so each block's effective alpha (times its learned gate under
`model.gates=learned`) is folded into the output projections of its attention and MLP, since
a (f W + b) = f (a W) + a b; under `lns` the 1/sqrt(l) shrink is folded into the block's two
norms, since Norm(x) s = x_hat (g s) + b s. Placements that normalise the residual stream
itself (post, deepnorm) or each sublayer's output (sandwich), and QK-norm, have no such form
and are refused.

Reading (`train.init_from=DIR`, `read_params`): a transformers folder of the family's
architecture, `config.json` and `model.safetensors`, whose shapes fit the config; the inverse of
the export. The architecture must be one our model computes (the family's `hf_checked`: GPT-2's
tanh GELU; Llama without grouped-query attention, biases or a tied head, at rope_theta 10000; the
same norm epsilon); blocks are pre-norm without gates or QK-norm. A tied head a folder holds must
equal the embedding; the buffers old checkpoints carry are not weights and are ignored. A mismatch
is one line naming it. The weights are the blocks' unscaled branches: what ProRes does with them
is the run's schedule (docs/EVALUATION.md, "Continue from Hugging Face weights").
"""
from __future__ import annotations

import json
import pathlib

import jax
import numpy as np

from andrea_jax.config import Config, ModelConfig
from andrea_jax.errors import ExportError, LoadError
from andrea_jax.model import prores, transformer
from andrea_jax.model.transformer import FAMILIES

WEIGHTS, CONFIG = "model.safetensors", "config.json"

# What the export multiplies, by our names (the families name a block's parameters alike where
# their roles are the same): by alpha, each branch's last affine map; under lns, by 1/sqrt(l),
# the gains and biases of the norms before the two sublayers.
ALPHA_FOLDED = frozenset({"attn_out_kernel", "attn_out_bias", "mlp_proj_kernel", "mlp_proj_bias"})
SHRINK_FOLDED = frozenset({"ln1_scale", "ln1_bias", "ln2_scale", "ln2_bias"})
# Why a placement has no Hugging Face form: their blocks are x + F(Norm(x)) and nothing else.
REFUSED = {
    "post": "its blocks normalise the residual stream, Norm(x + a F(x))",
    "sandwich": "its blocks also normalise each sublayer's output, x + a Norm(F(Norm(x)))",
    "deepnorm": "its blocks scale and normalise the residual stream, Norm(c x + a F(x))",
}


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


def _swap_layout(family, ours: str, x: np.ndarray) -> np.ndarray:
    """Our tensor `ours` in their layout, or theirs in ours: the same transpose either way."""
    return x.T if family.HF_TRANSPOSED and ours.endswith("kernel") else x


def _their_names(theirs: str | tuple[str, ...]) -> tuple[str, ...]:
    return theirs if isinstance(theirs, tuple) else (theirs,)


def refusal(m: ModelConfig) -> str | None:
    """Why the model of `m` has no Hugging Face form, or None when it has one."""
    family = FAMILIES[m.family]
    arch = family.HF_ARCHITECTURE
    if arch is None:
        return f"model.family={m.family} has no Hugging Face architecture; use --format native"
    if m.qk_norm:
        return (f"model.qk_norm=true cannot be exported as Hugging Face {arch}: its attention has no norm on "
                f"queries and keys; use --format native")
    if m.norm not in REFUSED:
        return None
    return (f"model.norm={m.norm} cannot be exported as Hugging Face {arch}: {REFUSED[m.norm]}, while "
            f"{arch} blocks are pre-norm, x + F({family.NORM}(x)) only; use --format native")


def folded_alphas(cfg: Config, step: int, flat: dict[str, np.ndarray]) -> np.ndarray:
    """[L] float32: what each block's branches are multiplied by at `step` (`flat`: flatten_params
    of the model's params, whose learned gates count too)."""
    alphas = np.asarray(prores.run_alphas(cfg, step), np.float32)
    if cfg.model.gates == "learned":
        alphas = alphas * flat["blocks/residual_gate"].astype(np.float32)
    return alphas


def state_dict(cfg: Config, flat: dict[str, np.ndarray], alphas: np.ndarray) -> dict[str, np.ndarray]:
    """Hugging Face's tensors of the model whose flatten_params is `flat`, `alphas` (folded_alphas)
    and lns's shrink folded in; float32, contiguous. Raises ExportError for a model that has no
    Hugging Face form."""
    reason = refusal(cfg.model)
    if reason:
        raise ExportError(reason)
    m, family = cfg.model, FAMILIES[cfg.model.family]
    out = {theirs: _swap_layout(family, ours, flat[ours]) for ours, theirs in family.HF_NAMES.items()}
    for i in range(m.n_layer):
        shrink = np.float32(1.0 / np.sqrt(i + 1.0)) if m.norm == "lns" else np.float32(1.0)
        for ours, theirs in family.HF_BLOCK_NAMES.items():
            x = flat[f"blocks/{ours}"][i]
            x = x * alphas[i] if ours in ALPHA_FOLDED else x * shrink if ours in SHRINK_FOLDED else x
            names = _their_names(theirs)
            out |= {f"{family.HF_BLOCK}{i}.{name}": _swap_layout(family, ours, part)
                    for name, part in zip(names, np.split(x, len(names), axis=-1))}
    return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def config_json(cfg: Config, step: int, alphas: np.ndarray, eot: int) -> dict:
    """The export's config.json: the family's transformers config, the special tokens (`eot`) and
    an `andrea` entry, for the reader only, of the step, schedule and folded alphas."""
    m, family = cfg.model, FAMILIES[cfg.model.family]
    named = {"family": m.family} if m.family != ModelConfig.family else {}  # the default is left implicit
    andrea = {"step": step, **named, "norm": m.norm, "gates": m.gates, "prores_schedule": cfg.prores.schedule,
              "prores_warmup": cfg.prores.warmup, "folded_alphas": [float(a) for a in alphas],
              "note": family.HF_FOLD_NOTE}
    return {**family.hf_config(m), "bos_token_id": eot, "eos_token_id": eot, "use_cache": True,
            "dtype": "float32", "torch_dtype": "float32",  # v5 reads dtype, v4 torch_dtype
            "andrea": andrea}


def _fail(folder, why: str):
    raise LoadError(f"train.init_from={folder}: {why}")


def _check_architecture(folder, theirs: dict, cfg: Config) -> None:
    m, family = cfg.model, FAMILIES[cfg.model.family]
    if family.HF_ARCHITECTURE is None:
        _fail(folder, f"model.family={m.family} has no Hugging Face architecture to read")
    if m.norm != "pre" or m.gates != "none" or m.qk_norm:
        _fail(folder, f"Hugging Face {m.family} blocks are pre-norm without gates or QK-norm; the config has "
                      f"model.norm={m.norm}, model.gates={m.gates}, model.qk_norm={m.qk_norm}")
    ours = family.hf_config(m)
    if theirs.get("model_type") != ours["model_type"]:
        _fail(folder, f"model_type {theirs.get('model_type')!r} is not {ours['model_type']!r}, the architecture "
                      f"of model.family={m.family}")
    for key, what in family.hf_checked(m).items():
        if key in theirs and theirs[key] != ours[key]:
            _fail(folder, f"its config.json has {key}={theirs[key]!r}, the model has {what}")


def _flat_params(family, tensors: dict, L: int) -> dict[str, np.ndarray]:
    """Our flat parameter names (flatten_params) from Hugging Face's tensors, each taken out of
    `tensors`, so that what is left has no place in the model."""
    take = lambda ours, theirs: _swap_layout(family, ours, tensors.pop(theirs))
    flat = {ours: take(ours, theirs) for ours, theirs in family.HF_NAMES.items()}
    for ours, theirs in family.HF_BLOCK_NAMES.items():
        flat[f"blocks/{ours}"] = np.stack([
            np.concatenate([take(ours, f"{family.HF_BLOCK}{i}.{name}") for name in _their_names(theirs)], axis=-1)
            for i in range(L)])
    for i in range(L):
        for buffer in family.HF_BUFFERS:
            tensors.pop(f"{family.HF_BLOCK}{i}.{buffer}", None)
    for theirs, ours in family.HF_TIED.items():
        tied = tensors.pop(theirs, None)
        if tied is not None and not np.array_equal(tied, flat[ours]):
            raise ValueError(f"{theirs} differs from {family.HF_NAMES[ours]} ({family.HF_ARCHITECTURE}'s head "
                             f"is tied)")
    return flat


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
        flat = _flat_params(FAMILIES[cfg.model.family], tensors, L)
    except KeyError as e:
        _fail(folder, f"{WEIGHTS} has no tensor {e.args[0]} (it needs model.n_layer={L} blocks of "
                      f"model.family={cfg.model.family})")
    except ValueError as e:
        _fail(folder, str(e))
    if tensors:
        _fail(folder, f"{WEIGHTS} has tensors the model has no place for: {', '.join(sorted(tensors)[:4])}"
                      + (" ..." if len(tensors) > 4 else "") + f" (more than model.n_layer={L} blocks?)")
    expected = {"/".join(k.key for k in p): s for p, s in
                jax.tree_util.tree_flatten_with_path(transformer.param_shapes(cfg.model))[0]}
    for name, shape in expected.items():
        if flat[name].shape != shape.shape:
            _fail(folder, f"{name} is {list(flat[name].shape)} there, {list(shape.shape)} in the model of the "
                          f"config (model.vocab_size={cfg.model.vocab_size}, seq_len={cfg.model.seq_len}, "
                          f"d_model={cfg.model.d_model}, mlp_ratio={cfg.model.mlp_ratio})")
    return unflatten_params({name: np.asarray(flat[name], np.float32) for name in expected})
