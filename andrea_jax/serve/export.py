"""Exporting a trained run: `andrea-export --workdir DIR --out OUT [--step N] [--format hf|native]`.

`hf` (default) writes a Hugging Face checkpoint that `transformers` loads with no code of ours:
`GPT2LMHeadModel.from_pretrained(OUT)` (for `model.family=llama`, `LlamaForCausalLM`) and
`AutoTokenizer.from_pretrained(OUT)`, the model exactly as it was at the step it was saved,
float32 throughout. The tensors and config.json are andrea_jax.model.hf's (the alphas and
lns's shrink folded in, the placements and options without such a form refused); this command
loads the run and writes the files.

Files: `config.json` (its `andrea` entry records the step, schedule and folded alphas, for the
reader only), `model.safetensors` (GPT-2: Conv1D weights are [in, out], which is our kernel layout;
no lm_head, tied to wte. Llama: q_proj, k_proj, v_proj split from our fused kernel, every Linear
[out, in], an untied lm_head), `generation_config.json`, and `tokenizer.json` with
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

from andrea_jax.model import hf
from andrea_jax.serve import load
from andrea_jax.errors import ExportError
from andrea_jax.data import tokenizer as tokenizer_lib
from andrea_jax.serve.load import LoadedModel
from andrea_jax.model.transformer import FAMILIES

FORMATS = ("hf", "native")
HF_FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json")


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
    alphas = hf.folded_alphas(loaded.cfg, loaded.step, flat)
    tensors = hf.state_dict(loaded.cfg, flat, alphas)  # raises ExportError for a refused placement, before any file
    eot = tokenizer_lib.eot_id(loaded.tokenizer)
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    jsons = {"config.json": hf.config_json(loaded.cfg, loaded.step, alphas, eot),
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
    arch = FAMILIES[loaded.cfg.model.family].HF_ARCHITECTURE
    what = f"Hugging Face {arch} checkpoint" if args.format == "hf" else "native export"
    print(f"wrote {what} of {loaded.source} (step {loaded.step}) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
