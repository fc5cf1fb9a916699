"""The config's checks: the helpers each section's `check` uses, and `validate`, which runs them all
with the checks that span sections, before anything is traced or compiled, and names the offending
key (`section.key`) in every error. Knows nothing of the sections' classes: it reads the fields of
the config it is given."""
from __future__ import annotations

import dataclasses
import typing

from andrea_jax.config_text import AnyConfig, parse_ramp
from andrea_jax.errors import ConfigError


def need(ok: bool, key: str, why: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {why}")


def positive(section: str, obj, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        need(value > 0, f"{section}.{name}", f"must be positive, got {value}")


def one_of(key: str, value: str, known, what: str) -> None:
    need(value in known, key, f"unknown {what} {value!r}; known: {', '.join(known)}")


def _check_types(config) -> None:
    for section in dataclasses.fields(config):
        sub = getattr(config, section.name)
        for name, kind in typing.get_type_hints(type(sub)).items():
            value = getattr(sub, name)  # an int may stand for a float; a bool is neither
            if not isinstance(value, (int, float) if kind is float else kind) or (
                    kind in (int, float) and isinstance(value, bool)):
                raise ConfigError(
                    f"{section.name}.{name}: expected {kind.__name__}, got {type(value).__name__} {value!r}")


def validate(config: AnyConfig) -> AnyConfig:
    """Raises ConfigError naming the first invalid key; returns the config unchanged. Each section
    checks its own fields; what depends on the machine (the mesh against the devices) is checked
    when the mesh is made, still before anything compiles."""
    _check_types(config)
    for section in dataclasses.fields(config):
        getattr(config, section.name).check()
    # The kernel backends fuse LayerNorm (with a bias) and bias + GELU; llama has neither.
    need(config.model.family != "llama" or config.model.remat != "gelu", "model.remat",
         "gelu recomputes the GPT-2 MLP's GELU output; model.family=llama's MLP is SwiGLU: use dots or full")
    need(config.model.family != "llama" or config.kernels.impl in ("auto", "xla"), "kernels.impl",
         f"{config.kernels.impl} has no RMSNorm or SwiGLU kernels for model.family=llama; "
         "use kernels.impl=xla or auto")
    need(config.optim.name == "adamw" or config.model.depth_param == "sp", "optim.name",  # their rules are Adam's
         f"muon has no rules for model.depth_param={config.model.depth_param}; use adamw or depth_param=sp")
    need(config.data.document_mask or not config.model.reset_positions, "model.reset_positions",
         "restarts positions at each document, which needs data.document_mask=true")
    # cuDNN takes the document mask as an additive bias, which its training kernels support only
    # at an even sequence length; refused here rather than at trace time
    need(not config.data.document_mask or config.model.attention == "xla" or config.model.seq_len % 2 == 0,
         "data.document_mask", f"cuDNN attention takes the mask only at an even model.seq_len, got "
         f"{config.model.seq_len}: use an even one or model.attention=xla")
    _check_ramps(config)
    return config


def _check_ramps(config) -> None:
    """What a ramp (train.batch_ramp, model.seq_len_ramp) cannot run with, each refused in one line."""
    m, t = config.model, config.train
    key = "train.batch_ramp" if t.batch_ramp else "model.seq_len_ramp"
    if not (t.batch_ramp or m.seq_len_ramp):
        return
    need(not t.flops, "train.flops", f"a FLOP budget is not resolved over {key}'s changing shapes; "
         "set train.tokens instead")
    need(not config.data.mixture, "data.mixture", f"is not served at {key}'s changing shapes")
    batches = [b for b, _ in parse_ramp("train.batch_ramp", t.batch_ramp)] + [t.batch_size]
    lengths = [n for n, _ in parse_ramp("model.seq_len_ramp", m.seq_len_ramp)] + [m.seq_len]
    for batch in batches:
        for length in lengths:  # a step reads whole windows of the full length: no token skipped or repeated
            need(batch * length % m.seq_len == 0, key, f"a step of batch {batch} x length {length} does "
                 f"not read whole windows of model.seq_len={m.seq_len}; every stage batch x stage length must "
                 f"be a multiple of model.seq_len")
    need(not config.data.document_mask or m.attention == "xla" or all(n % 2 == 0 for n in lengths),
         "model.seq_len_ramp", "cuDNN attention takes data.document_mask only at even lengths: use even "
         "stage lengths or model.attention=xla")
