"""Exporting a trained run: `python -m andrea_jax.export --workdir DIR --out OUT [--step N] [--format hf|native]`.

`hf` (default) writes a Hugging Face GPT-2 checkpoint that `transformers` loads as it would
OpenAI's GPT-2, with no code of ours: `GPT2LMHeadModel.from_pretrained(OUT)` and
`AutoTokenizer.from_pretrained(OUT)`. ANDREA is GPT-2 plus a ProRes alpha per block, so the export
folds each block's effective alpha (times its learned gate under `model.gates=learned`) into the
output projections of its attention and MLP, since a (f W + b) = f (a W) + a b; under `lns` it folds
the 1/sqrt(l) shrink into the block's two LayerNorms, since LN(x) s = (x - m) / sd * (g s) + b s.
The model is then exactly GPT-2 at the step it was saved, float32 throughout.
Placements that normalise the residual stream itself (post, deepnorm) or each sublayer's output
(sandwich) have no GPT-2 form and are refused; their exports are `native`.

Files: `config.json` (GPT2Config; its `andrea` entry records the step, schedule and folded alphas,
for the reader only), `model.safetensors` (GPT-2's names; Conv1D weights are [in, out], which is
our kernel layout; no lm_head, tied to wte), `generation_config.json`, and `tokenizer.json` with
`tokenizer_config.json` (PreTrainedTokenizerFast over our byte-level BPE: our ids, no BOS added).

`native` is `load.save_native`: every placement, read back bit-exactly by `load.load`.
Nothing is pickled in either format.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

from andrea_jax.serve import load
from andrea_jax.errors import ExportError
from andrea_jax.data import tokenizer as tokenizer_lib
from andrea_jax.serve.load import LoadedModel

FORMATS = ("hf", "native")
HF_FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json")
# Why a placement has no GPT-2 form: GPT-2's blocks are x + F(LN(x)) and nothing else.
HF_REFUSED = {
    "post": "its blocks normalise the residual stream, Norm(x + a F(x))",
    "sandwich": "its blocks also normalise each sublayer's output, x + a Norm(F(Norm(x)))",
    "deepnorm": "its blocks scale and normalise the residual stream, Norm(c x + a F(x))",
}




def hf_refusal(loaded: LoadedModel) -> str | None:
    """Why `loaded` has no Hugging Face GPT-2 form, or None when it has one."""
    norm = loaded.cfg.model.norm
    if norm not in HF_REFUSED:
        return None
    return (f"model.norm={norm} cannot be exported as Hugging Face GPT-2: {HF_REFUSED[norm]}, while "
            f"GPT-2 blocks are pre-norm, x + F(LN(x)) only; use --format native")


def effective_alphas(loaded: LoadedModel, flat: dict[str, np.ndarray]) -> np.ndarray:
    """[L] float32: what each block's branches are multiplied by at the loaded step."""
    alphas = np.asarray(loaded.alphas(), np.float32)
    if loaded.cfg.model.gates == "learned":
        alphas = alphas * flat["blocks/residual_gate"].astype(np.float32)
    return alphas


def hf_state_dict(loaded: LoadedModel, flat: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """GPT-2's tensors with the alphas (and the lns shrink) folded in; float32, contiguous.

    `flat` is `load.flatten_params(loaded.params)` when the caller already has it."""
    reason = hf_refusal(loaded)
    if reason:
        raise ExportError(reason)
    flat = load.flatten_params(loaded.params) if flat is None else flat
    alphas = effective_alphas(loaded, flat)
    lns = loaded.cfg.model.norm == "lns"
    blocks = {k.removeprefix("blocks/"): v for k, v in flat.items() if k.startswith("blocks/")}
    out = {"transformer.wte.weight": flat["tok_embedding"], "transformer.wpe.weight": flat["pos_embedding"],
           "transformer.ln_f.weight": flat["lnf_scale"], "transformer.ln_f.bias": flat["lnf_bias"]}
    for i in range(loaded.cfg.model.n_layer):
        a = alphas[i]
        shrink = np.float32(1.0 / np.sqrt(i + 1.0)) if lns else np.float32(1.0)
        b = {k: v[i] for k, v in blocks.items()}
        h = f"transformer.h.{i}."
        out |= {
            h + "ln_1.weight": b["ln1_scale"] * shrink, h + "ln_1.bias": b["ln1_bias"] * shrink,
            h + "attn.c_attn.weight": b["attn_qkv_kernel"], h + "attn.c_attn.bias": b["attn_qkv_bias"],
            h + "attn.c_proj.weight": b["attn_out_kernel"] * a, h + "attn.c_proj.bias": b["attn_out_bias"] * a,
            h + "ln_2.weight": b["ln2_scale"] * shrink, h + "ln_2.bias": b["ln2_bias"] * shrink,
            h + "mlp.c_fc.weight": b["mlp_fc_kernel"], h + "mlp.c_fc.bias": b["mlp_fc_bias"],
            h + "mlp.c_proj.weight": b["mlp_proj_kernel"] * a, h + "mlp.c_proj.bias": b["mlp_proj_bias"] * a,
        }
    return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def hf_config(loaded: LoadedModel, alphas: np.ndarray) -> dict:
    m, eot = loaded.cfg.model, tokenizer_lib.eot_id(loaded.tokenizer)
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
        "andrea": {"step": loaded.step, "norm": m.norm, "gates": m.gates,
                   "prores_schedule": loaded.cfg.prores.schedule, "prores_warmup": loaded.cfg.prores.warmup,
                   "folded_alphas": [float(a) for a in alphas],
                   "note": "ProRes alphas (and learned gates) are folded into c_proj; lns's 1/sqrt(l) into ln_1, ln_2"},
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
    """Writes the Hugging Face GPT-2 export of `loaded` into folder `out`; refuses before writing."""
    from safetensors.numpy import save_file

    flat = load.flatten_params(loaded.params)
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
    parser = argparse.ArgumentParser(prog="python -m andrea_jax.export", description=__doc__.split("\n\n")[0])
    load.add_source_args(parser)
    parser.add_argument("--out", required=True, help="the folder to write the export into")
    parser.add_argument("--format", choices=FORMATS, default="hf",
                        help="hf: a transformers GPT-2 checkpoint (pre and lns only); native: every placement")
    args = parser.parse_args(argv)
    try:
        loaded = load.load_from_args(args)
        out = export(loaded, args.out, args.format)
    except (load.LoadError, ExportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    what = "Hugging Face GPT-2 checkpoint" if args.format == "hf" else "native export"
    print(f"wrote {what} of {loaded.source} (step {loaded.step}) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
