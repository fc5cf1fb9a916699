"""Settings given as text (`--set section.key=value`): `override` applies them to a config, each value
parsed by its field's type; the settings that are lists in a string (mesh.rules, data.mixture); and
the known key nearest to a mistyped one. Knows nothing of the config's sections (config.py passes
them; `override` reads them off the config it is given)."""
from __future__ import annotations

import dataclasses
import difflib
import math
import typing

from andrea_jax.errors import ConfigError
from andrea_jax.names import LOGICAL_AXES, MESH_AXES

_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
AnyConfig = typing.TypeVar("AnyConfig")  # andrea_jax.config.Config: a dataclass whose fields are its sections


def parse_value(key: str, text: str, kind: type):
    try:
        if kind is bool:
            return _BOOLS[text.lower()]
        return int(text.replace("_", "")) if kind is int else kind(text)
    except (KeyError, ValueError):
        raise ConfigError(f"{key}: expected {kind.__name__}, got {text!r}") from None


def known_keys(config: AnyConfig) -> dict[str, list[str]]:
    """{section: [names]} of a config's sections, as `nearest_key` takes them."""
    return {s.name: list(typing.get_type_hints(type(getattr(config, s.name)))) for s in dataclasses.fields(config)}


def override(config: AnyConfig, assignments: typing.Sequence[str]) -> AnyConfig:
    """Applies `section.key=value` strings, parsing each value by the field's declared type."""
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot:
            raise ConfigError(f"override {assignment!r} is not of the form section.key=value")
        if section not in {f.name for f in dataclasses.fields(config)}:
            raise ConfigError(f"unknown config key {key!r}: no section {section!r}"
                              f"{nearest_key(known_keys(config), key)}")
        sub = getattr(config, section)
        hints = typing.get_type_hints(type(sub))
        if name not in hints:
            raise ConfigError(f"unknown config key {key!r}{nearest_key(known_keys(config), key)}")
        sub = dataclasses.replace(sub, **{name: parse_value(key, text, hints[name])})
        config = dataclasses.replace(config, **{section: sub})
    return config


def nearest_key(known: dict[str, list[str]], key: str) -> str:
    """'; did you mean KEY?' for a `section.name` (or a bare section) that is not in `known`
    ({section: [names]}): a name of its section (of the nearest section when its own is unknown),
    else the same name in another section, else the nearest section alone; '' when nothing is near."""
    section, _, name = key.partition(".")
    close = lambda word, words: difflib.get_close_matches(word, words, n=1)
    home = section if section in known else next(iter(close(section, list(known))), None)
    near = [f"{home}.{m}" for m in close(name, known[home])] if home and name else []
    near = near or [f"{s}.{name}" for s in known if name and name in known[s]]
    near = near or ([home if not name else f"section {home}"] if home and home != section else [])
    return f"; did you mean {near[0]}?" if near else ""


def parse_rules(text: str) -> dict[str, tuple[str, ...]]:
    """`mesh.rules` ("batch=data+fsdp,embed=,vocab=tensor") as {name: mesh axes}; '' = {}."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, axes = (s.strip() for s in item.partition("="))
        if not sep or name not in LOGICAL_AXES:
            raise ConfigError(f"mesh.rules: {item!r} is not NAME=AXIS[+AXIS] with NAME one of "
                              f"{', '.join(LOGICAL_AXES)}")
        out[name] = tuple(filter(None, (a.strip() for a in axes.split("+"))))
        bad = [a for a in out[name] if a not in MESH_AXES]
        if bad:
            raise ConfigError(f"mesh.rules: {item!r} names {bad[0]!r}; mesh axes are {', '.join(MESH_AXES)}")
    return out


def parse_mixture(spec: str) -> list[tuple[str, float]]:
    """`data.mixture` as [(path, weight)], the weights normalised to sum 1; '' = []. A path may hold
    ':' (gs://...): the weight is after the last one."""
    entries = []
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        path, _, weight = entry.rpartition(":")
        try:
            value = float(weight)
        except ValueError:
            value = float("nan")
        if not (path and value > 0 and math.isfinite(value)):
            raise ConfigError(f"data.mixture: entry {entry!r} must be PATH:WEIGHT with a weight > 0")
        entries.append((path, value))
    total = sum(w for _, w in entries)
    return [(path, w / total) for path, w in entries]


def _whole(text: str) -> int | None:
    """An integer written as 1000, 1_000 or 1e3; None for anything else."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if math.isfinite(value) and value.is_integer() else None


def parse_ramp(key: str, spec: str) -> list[tuple[int, int]]:
    """A ramp (train.batch_ramp, model.seq_len_ramp), SIZE@TOKENS,SIZE@TOKENS,...: [(size, tokens)],
    each size used until that many tokens have been seen; '' = []. The tokens must rise."""
    stages = []
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        size, _, tokens = entry.partition("@")
        size, tokens = _whole(size.strip()), _whole(tokens.strip())
        if size is None or tokens is None or size <= 0 or tokens <= 0:
            raise ConfigError(f"{key}: stage {entry!r} must be SIZE@TOKENS with positive integers "
                              f"(a size used until TOKENS tokens have been seen)")
        if stages and tokens <= stages[-1][1]:
            raise ConfigError(f"{key}: stage {entry!r} ends at {tokens} tokens, not after the stage before "
                              f"it ({stages[-1][1]}): the stages' token counts must rise")
        stages.append((size, tokens))
    return stages
