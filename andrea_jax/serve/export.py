"""Exporting a trained run: `andrea-export --workdir DIR --out OUT [--step N] [--format hf|native]`.

`hf` (default) writes a Hugging Face GPT-2 checkpoint that `transformers` loads as it would
OpenAI's GPT-2, with no code of ours: `GPT2LMHeadModel.from_pretrained(OUT)` and
`AutoTokenizer.from_pretrained(OUT)`. ANDREA is GPT-2 plus a ProRes alpha per block, so the export
folds each block's effective alpha (times its learned gate under `model.gates=learned`) into the
output projections of its attention and MLP, since a (f W + b) = f (a W) + a b; under `lns` it folds
the 1/sqrt(l) shrink into the block's two LayerNorms, since LN(x) s = (x - m) / sd * (g s) + b s.
The model is then exactly GPT-2 at the step it was saved, float32 throughout.
Placements that normalise the residual stream itself (post, deepnorm) or each sublayer's output
(sandwich) have no GPT-2 form and are refused; their exports are `native`.

`model.family=llama` writes a `LlamaForCausalLM` instead (`LlamaForCausalLM.from_pretrained(OUT)`),
with the same folds: the alphas (and gates) into o_proj and down_proj (no biases), lns's shrink
into the RMSNorm gains (RMS(x) s = x / rms(x) * (g s)); the fused [q|k|v] kernel is split into
q_proj, k_proj, v_proj and every matrix transposed to torch's [out, in]. Our RoPE already uses HF
Llama's rotate_half layout (model/llama.py), so q and k need no permutation. The same placements
are refused. The head is untied (lm_head.weight).

Files: `config.json` (GPT2Config; its `andrea` entry records the step, schedule and folded alphas,
for the reader only), `model.safetensors` (GPT-2's names; Conv1D weights are [in, out], which is
our kernel layout; no lm_head, tied to wte), `generation_config.json`, and `tokenizer.json` with
`tokenizer_config.json` (PreTrainedTokenizerFast over our byte-level BPE: our ids, no BOS added).

`native` is `load.save_native`: every placement, read back bit-exactly by `load.load`.
Nothing is pickled in either format.
"""
from __future__ import annotations

if __name__ == "__main__":  # python -m andrea_jax.serve.export: jax starts as the console scripts start
    from andrea_jax import startup  # it (andrea_jax/commands.py), before the imports below import it
    startup.start_jax()

import argparse
import json
import pathlib
import sys

import numpy as np

from andrea_jax.model import hf
from andrea_jax.serve import load
from andrea_jax.errors import ExportError
from andrea_jax.data import tokenizer as tokenizer_lib
from andrea_jax.serve.load import LoadedModel
from andrea_jax.model.llama import ROPE_THETA

FORMATS = ("hf", "native")
HF_FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json")
# Why a placement has no GPT-2 (or Llama) form: their blocks are x + F(Norm(x)) and nothing else.
HF_REFUSED = {
    "post": "its blocks normalise the residual stream, Norm(x + a F(x))",
    "sandwich": "its blocks also normalise each sublayer's output, x + a Norm(F(Norm(x)))",
    "deepnorm": "its blocks scale and normalise the residual stream, Norm(c x + a F(x))",
}

# The transformers architecture of each model.family, and the norm its blocks apply.
ARCHITECTURES = {"gpt2": ("GPT-2", "LN"), "llama": ("Llama", "RMSNorm")}


def hf_refusal(loaded: LoadedModel) -> str | None:
    """Why `loaded` has no Hugging Face GPT-2 (or Llama) form, or None when it has one."""
    norm = loaded.cfg.model.norm
    arch, norm_name = ARCHITECTURES[loaded.cfg.model.family]
    if loaded.cfg.model.qk_norm:
        return (f"model.qk_norm=true cannot be exported as Hugging Face {arch}: its attention has no norm on "
                f"queries and keys; use --format native")
    if norm not in HF_REFUSED:
        return None
    return (f"model.norm={norm} cannot be exported as Hugging Face {arch}: {HF_REFUSED[norm]}, while "
            f"{arch} blocks are pre-norm, x + F({norm_name}(x)) only; use --format native")


def effective_alphas(loaded: LoadedModel, flat: dict[str, np.ndarray]) -> np.ndarray:
    """[L] float32: what each block's branches are multiplied by at the loaded step."""
    alphas = np.asarray(loaded.alphas(), np.float32)
    if loaded.cfg.model.gates == "learned":
        alphas = alphas * flat["blocks/residual_gate"].astype(np.float32)
    return alphas


def hf_state_dict(loaded: LoadedModel, flat: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """GPT-2's tensors with the alphas (and the lns shrink) folded in; float32, contiguous.

    `flat` is `hf.flatten_params(loaded.params)` when the caller already has it."""
    reason = hf_refusal(loaded)
    if reason:
        raise ExportError(reason)
    flat = hf.flatten_params(loaded.params) if flat is None else flat
    alphas = effective_alphas(loaded, flat)
    if loaded.cfg.model.family == "llama":
        return _contiguous(llama_state_dict(loaded, flat, alphas))
    lns = loaded.cfg.model.norm == "lns"
    blocks = {k.removeprefix("blocks/"): v for k, v in flat.items() if k.startswith("blocks/")}
    out = {theirs: flat[ours] for ours, theirs in hf.GPT2_NAMES.items()}
    for i in range(loaded.cfg.model.n_layer):
        a = alphas[i]
        shrink = np.float32(1.0 / np.sqrt(i + 1.0)) if lns else np.float32(1.0)
        scale = {"ln1_scale": shrink, "ln1_bias": shrink, "ln2_scale": shrink, "ln2_bias": shrink,
                 "attn_out_kernel": a, "attn_out_bias": a, "mlp_proj_kernel": a, "mlp_proj_bias": a}
        out |= {f"{hf.GPT2_BLOCK}{i}.{theirs}": blocks[ours][i] * scale[ours] if ours in scale else blocks[ours][i]
                for ours, theirs in hf.GPT2_BLOCK_NAMES.items()}
    return _contiguous(out)


def _contiguous(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}


def llama_state_dict(loaded: LoadedModel, flat: dict[str, np.ndarray], alphas: np.ndarray) -> dict[str, np.ndarray]:
    """HF Llama's tensors of a llama-family model, alphas (and the lns shrink) folded in; torch's
    Linear weights are [out, in], the transpose of our kernels."""
    m = loaded.cfg.model
    D, lns = m.d_model, m.norm == "lns"
    blocks = {k.removeprefix("blocks/"): v for k, v in flat.items() if k.startswith("blocks/")}
    out = {theirs: flat[ours] for ours, theirs in hf.LLAMA_NAMES.items()} | {hf.LLAMA_HEAD: flat["lm_head_kernel"].T}
    for i in range(m.n_layer):
        a = alphas[i]
        shrink = np.float32(1.0 / np.sqrt(i + 1.0)) if lns else np.float32(1.0)
        b = {k: v[i] * shrink if k in hf.LLAMA_NORMS else v[i] for k, v in blocks.items()}
        b["attn_out_kernel"], b["mlp_proj_kernel"] = b["attn_out_kernel"] * a, b["mlp_proj_kernel"] * a
        qkv = b["attn_qkv_kernel"]  # columns [q | k | v], each H heads x K
        for ours, theirs in hf.LLAMA_BLOCK_NAMES.items():
            h = f"{hf.LLAMA_BLOCK}{i}."
            if isinstance(theirs, tuple):
                out |= {h + name: qkv[:, j * D:(j + 1) * D].T for j, name in enumerate(theirs)}
            else:
                out[h + theirs] = b[ours] if ours in hf.LLAMA_NORMS else b[ours].T
    return out


def _andrea_entry(loaded: LoadedModel, alphas: np.ndarray, note: str) -> dict:
    m = loaded.cfg.model
    family = {"family": m.family} if m.family != "gpt2" else {}  # gpt2, the default, is left implicit
    return {"step": loaded.step, **family, "norm": m.norm, "gates": m.gates,
            "prores_schedule": loaded.cfg.prores.schedule, "prores_warmup": loaded.cfg.prores.warmup,
            "folded_alphas": [float(a) for a in alphas], "note": note}


def llama_config(loaded: LoadedModel, alphas: np.ndarray) -> dict:
    m, eot = loaded.cfg.model, tokenizer_lib.eot_id(loaded.tokenizer)
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "vocab_size": m.vocab_size, "hidden_size": m.d_model, "intermediate_size": m.mlp_ratio * m.d_model,
        "num_hidden_layers": m.n_layer, "num_attention_heads": m.n_head, "num_key_value_heads": m.n_head,
        "head_dim": m.d_model // m.n_head, "hidden_act": "silu", "max_position_embeddings": m.seq_len,
        "rms_norm_eps": m.ln_eps, "initializer_range": m.init_std,
        # v5 reads rope_parameters, v4 rope_theta
        "rope_theta": ROPE_THETA, "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "pretraining_tp": 1,
        "tie_word_embeddings": False, "bos_token_id": eot, "eos_token_id": eot,
        "use_cache": True, "dtype": "float32", "torch_dtype": "float32",
        "andrea": _andrea_entry(loaded, alphas, "ProRes alphas (and learned gates) are folded into o_proj and "
                                "down_proj; lns's 1/sqrt(l) into the two RMSNorm gains"),
    }


def hf_config(loaded: LoadedModel, alphas: np.ndarray) -> dict:
    m, eot = loaded.cfg.model, tokenizer_lib.eot_id(loaded.tokenizer)
    if m.family == "llama":
        return llama_config(loaded, alphas)
    return {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        "vocab_size": m.vocab_size, "n_positions": m.seq_len, "n_embd": m.d_model, "n_layer": m.n_layer,
        "n_head": m.n_head, "n_inner": m.mlp_ratio * m.d_model,
        "activation_function": "gelu_new",  # tanh GELU, as kernels.bias_gelu
        "layer_norm_epsilon": m.ln_eps, "initializer_range": m.init_std,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True, "bos_token_id": eot, "eos_token_id": eot,
        "use_cache": True, "dtype": "float32", "torch_dtype": "float32",  # v5 reads dtype, v4 torch_dtype
        "andrea": _andrea_entry(loaded, alphas, "ProRes alphas (and learned gates) are folded into c_proj; "
                                "lns's 1/sqrt(l) into ln_1, ln_2"),
    }


def hf_tokenizer_files(loaded: LoadedModel) -> dict[str, dict]:
    eot, S = tokenizer_lib.EOT, loaded.cfg.model.seq_len
    specials = {"bos_token": eot, "eos_token": eot, "unk_token": eot}
    return {
        # The fast tokenizer over tokenizer.json as it is: GPT2TokenizerFast would rebuild it and may add tokens.
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", **specials,
                                  "model_max_length": S, "add_prefix_space": False, "add_bos_token": False,
                                  "clean_up_tokenization_spaces": False},
        "special_tokens_map.json": specials,
    }


def save_hf(loaded: LoadedModel, out) -> pathlib.Path:
    """Writes the Hugging Face GPT-2 (or Llama) export of `loaded` into folder `out`; refuses before writing."""
    from safetensors.numpy import save_file

    flat = hf.flatten_params(loaded.params)
    tensors = hf_state_dict(loaded, flat)  # raises ExportError for a refused placement, before any file
    eot = tokenizer_lib.eot_id(loaded.tokenizer)
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    jsons = {"config.json": hf_config(loaded, effective_alphas(loaded, flat)),
             # No max_length: transformers warns when it meets max_new_tokens; n_positions bounds it.
             "generation_config.json": {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot},
             **hf_tokenizer_files(loaded)}
    for name, tree in jsons.items():
        (out / name).write_text(json.dumps(tree, indent=2) + "\n")
    loaded.tokenizer.save(str(out / load.TOKENIZER))
    return out


def export(loaded: LoadedModel, out, fmt: str = "hf") -> pathlib.Path:
    if fmt == "native":
        return load.save_native(loaded, out)
    if fmt == "hf":
        return save_hf(loaded, out)
    raise ExportError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="andrea-export", description=__doc__.split("\n\n")[0])
    load.add_source_args(parser)
    parser.add_argument("--out", required=True, help="the folder to write the export into")
    parser.add_argument("--format", choices=FORMATS, default="hf",
                        help="hf: a transformers GPT-2 (model.family=llama: Llama) checkpoint (pre and lns "
                             "only); native: every placement")
    args = parser.parse_args(argv)
    try:
        loaded = load.load_from_args(args)
        out = export(loaded, args.out, args.format)
    except (load.LoadError, ExportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    arch = ARCHITECTURES[loaded.cfg.model.family][0]
    what = f"Hugging Face {arch} checkpoint" if args.format == "hf" else "native export"
    print(f"wrote {what} of {loaded.source} (step {loaded.step}) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
