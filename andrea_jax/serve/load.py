"""Loading a run for inference: one function, `load`, behind export, generate, evaluate, the
lm-eval adapter and the trainer's closing sample.

From a workdir it reads the config the run saved, its tokenizer and the *parameters only* of the
newest checkpoint (or of `step`): Orbax restores the `params` subtree of the saved train state and
never reads the optimizer state. From a native export (`andrea-export --format native`) it reads
safetensors, a JSON config and the tokenizer. Either way the parameters land on the current devices
(replicated over them) as float32 arrays, and nothing is unpickled.

The native format is defined here, beside its reader: `model.safetensors` holds every parameter
under its flax path joined by '/', e.g. `blocks/attn_qkv_kernel` [L, D, 3D] (the scan's stacked
layout), `config.json` the whole config tree plus the step, `tokenizer.json` the BPE.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from tokenizers import Tokenizer

from andrea_jax import checkpoint, configs, mesh, model as model_lib
from andrea_jax.model import hf, prores
from andrea_jax.config import Config
from andrea_jax.errors import ConfigError, LoadError
from andrea_jax.workdir import Workdir

NATIVE_WEIGHTS, NATIVE_CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"
NATIVE_FORMAT = "andrea-native-1"




@dataclasses.dataclass(frozen=True)
class LoadedModel:
    cfg: Config
    params: dict           # the model's `params` tree, float32, placed on the current devices
    tokenizer: Tokenizer
    step: int              # optimizer updates the parameters have seen (sets the ProRes alphas)
    source: str            # the checkpoint or export folder it came from

    def alphas(self) -> jnp.ndarray:
        """alpha(l, step) for l = 1..L under the run's schedule: what the model ran with at `step`."""
        return prores.run_alphas(self.cfg, self.step)

    def model(self, impl: str | None = None) -> model_lib.Andrea:
        return model_lib.Andrea(self.cfg.model, impl or self.cfg.kernels.impl)


def config_from_dict(tree: dict, where: str) -> Config:
    """A validated Config from its `to_dict()` form; unknown keys (from a newer version) are an error."""
    try:
        return configs.from_dict(tree)
    except ConfigError as e:
        raise LoadError(f"{where}: not a config of this version of andrea_jax ({e})") from None


def _replicated():
    """Parameters for inference live whole on every device of the default mesh."""
    return jax.sharding.NamedSharding(mesh.make_mesh(), jax.sharding.PartitionSpec())


def _restore_params(step_dir: pathlib.Path, cfg: Config, weights: str = "params"):
    """The parameters (or `weights`) of the checkpoint in step_dir, replicated over the current devices."""
    shapes = model_lib.param_shapes(cfg.model)
    replicated = _replicated()
    target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated), shapes)
    return checkpoint.read_params(step_dir, target, weights)


def _read_json(json_path: pathlib.Path, companions, what: str) -> dict:
    """json_path parsed, once it and its companion files are known to exist (else: `what`)."""
    for path in (json_path, *companions):
        if not path.is_file():
            raise LoadError(f"{path}: missing; {what}")
    try:
        return json.loads(json_path.read_text())
    except json.JSONDecodeError as e:
        raise LoadError(f"{json_path}: not JSON ({e})") from None


def load_workdir(workdir, step: int | None = None, weights: str = "params") -> LoadedModel:
    workdir = pathlib.Path(workdir)
    if not workdir.is_dir():
        raise LoadError(f"{workdir}: no such run folder")
    run = Workdir(workdir)
    cfg_path, tok_path = run.config, run.tokenizer
    cfg = config_from_dict(_read_json(cfg_path, [tok_path], f"{workdir} is not a training run's workdir"),
                           str(cfg_path))
    steps = run.checkpoint_steps()
    if not steps:
        raise LoadError(f"{run.checkpoints}: no checkpoint to load (train with train.checkpoint_every > 0)")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise LoadError(f"{run.checkpoints / str(step)}: no such checkpoint; steps kept: "
                        f"{', '.join(map(str, steps))}")
    step_dir = run.checkpoints / str(step)
    if weights == "ema" and not cfg.optim.ema:
        raise LoadError(f"{workdir}: --weights ema needs a run trained with optim.ema > 0; this one has none")
    try:
        params = _restore_params(step_dir.resolve(), cfg, weights)  # orbax wants an absolute path
    except Exception as e:  # orbax / tensorstore raise many types; all mean the same to the user
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise LoadError(f"{step_dir}: checkpoint cannot be read ({type(e).__name__}: {reason})") from None
    source = str(step_dir) if weights == "params" else f"{step_dir} ({weights})"
    return LoadedModel(cfg, params, Tokenizer.from_file(str(tok_path)), step, source)


def save_native(loaded: LoadedModel, out) -> pathlib.Path:
    """Writes a native export of `loaded` into folder `out` (every placement; reads back bit-exactly)."""
    from safetensors.numpy import save_file

    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(hf.flatten_params(loaded.params), str(out / NATIVE_WEIGHTS),
              metadata={"format": NATIVE_FORMAT, "step": str(loaded.step)})
    (out / NATIVE_CONFIG).write_text(json.dumps(
        {"format": NATIVE_FORMAT, "step": loaded.step, "config": loaded.cfg.to_dict()}, indent=2))
    loaded.tokenizer.save(str(out / TOKENIZER))
    return out


def load_export(path) -> LoadedModel:
    """A native export written by `save_native` (a Hugging Face export is for transformers)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = pathlib.Path(path)
    cfg_path, weights, tok_path = path / NATIVE_CONFIG, path / NATIVE_WEIGHTS, path / TOKENIZER
    meta = _read_json(cfg_path, [weights, tok_path], f"{path} is not a native export of andrea_jax")
    if meta.get("format") != NATIVE_FORMAT:
        hint = " (a Hugging Face export: load it with transformers)" if "model_type" in meta else ""
        raise LoadError(f"{path}: not a native export of andrea_jax{hint}")
    cfg = config_from_dict(meta["config"], str(cfg_path))
    try:
        flat = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as e:
        raise LoadError(f"{weights}: cannot be read ({e})") from None
    expected = {"/".join(k.key for k in p): s for p, s in
                jax.tree_util.tree_flatten_with_path(model_lib.param_shapes(cfg.model))[0]}
    if set(flat) != set(expected) or any(flat[k].shape != expected[k].shape for k in expected):
        raise LoadError(f"{weights}: its tensors do not match the model its config describes")
    params = jax.device_put(hf.unflatten_params(flat), _replicated())
    return LoadedModel(cfg, params, Tokenizer.from_file(str(tok_path)), int(meta["step"]), str(path))


def load(*, workdir=None, export=None, step: int | None = None, weights: str = "params") -> LoadedModel:
    """The model of a run for inference: from `workdir` (newest checkpoint, or `step`; its
    parameters, or with weights="ema" their moving average) or `export`."""
    if (workdir is None) == (export is None):
        raise ValueError("give exactly one of workdir or export")
    if export is not None:
        if step is not None or weights != "params":
            raise LoadError(f"{export}: an export holds one set of weights; --step and --weights are for a workdir")
        return load_export(export)
    return load_workdir(workdir, step, weights)


def add_source_args(parser) -> None:
    """--workdir / --export / --step, shared by the command lines of export, generate and evaluate."""
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--workdir", help="a training run's folder (its newest checkpoint unless --step)")
    group.add_argument("--export", help="a native export folder (andrea-export --format native)")
    parser.add_argument("--step", type=int, help="the checkpoint step to load from --workdir")
    parser.add_argument("--weights", choices=tuple(checkpoint.WEIGHTS), default="params",
                        help="from --workdir: the parameters, or (a run with optim.ema) their moving average")


def load_from_args(args) -> LoadedModel:
    return load(workdir=args.workdir, export=getattr(args, "export", None), step=args.step,
                weights=getattr(args, "weights", "params"))
