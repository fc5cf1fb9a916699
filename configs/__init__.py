"""Where a Config comes from: `load` reads a named config (`python train.py --config NAME` loads
`configs/NAME.py:get_config()`), `from_dict` a config that a run or an export saved.

A named config states only what differs from the schema's defaults (andrea_jax.config). The
defaults are ANDREA-120M with the ProRes paper's setup, and they stay the truth rather than
becoming neutral placeholders: `from_dict` fills every key a saved run's config lacks with them,
and a user's config file builds on them, so they must mean a real, documented model. Each field's
comment in the schema says what its default is and why; a named config is the list of its
differences, so a reader sees at a glance what makes `tiny` tiny or `depth` deep.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pathlib

from andrea_jax.config import Config, validate
from andrea_jax.config_text import known_keys, nearest_key
from andrea_jax.errors import ConfigError


def load(name_or_path: str) -> Config:
    """Loads `configs/NAME.py` or a path to such a file; the module defines `get_config()`.

    `NAME:ARG` (as big_vision's `--config file.py:arg`) passes the text after the colon to
    `get_config(ARG)`: `depth:family=71m,layers=48` is one member of the depth sweep."""
    name_or_path, _, arg = name_or_path.partition(":")
    path = pathlib.Path(name_or_path)
    # A config is user code: whatever it raises (a syntax error, a bad import) is a config error.
    try:
        if path.suffix == ".py":
            if not path.is_file():
                raise ConfigError(f"config file {name_or_path!r} does not exist")
            spec = importlib.util.spec_from_file_location(f"_andrea_config_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = _import_named(name_or_path)
        if not callable(getattr(module, "get_config", None)):
            raise ConfigError(f"config {name_or_path!r} defines no get_config()")
        config = module.get_config(arg) if arg else module.get_config()
    except ConfigError:
        raise
    except Exception as e:
        where = f" (line {e.lineno})" if isinstance(e, SyntaxError) and e.lineno else ""
        message = " ".join(str(getattr(e, "msg", None) or e).split())
        raise ConfigError(f"config {name_or_path!r} cannot be loaded{where}: "
                          f"{type(e).__name__}: {message}") from e
    if not isinstance(config, Config):
        raise ConfigError(f"get_config() in {name_or_path!r} must return andrea_jax.config.Config")
    return config


def _import_named(name: str):
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if not e.name or not f"{__name__}.{name}.".startswith(e.name + "."):
            raise  # the config exists but imports something missing: not an unknown name
        known = sorted(p.stem for p in pathlib.Path(__file__).parent.glob("*.py") if not p.stem.startswith("_"))
        raise ConfigError(f"unknown config {name!r}; known: {', '.join(known)}") from None


# Keys that configs saved in runs and exports may hold though no field reads them: from_dict drops them.
RETIRED = {"data": ("pretokenize", "stream_workers")}


def from_dict(tree: dict) -> Config:
    """A validated Config from its `to_dict()` form; an unknown key (from a newer version) is a ConfigError."""
    tree = {name: {k: v for k, v in fields.items() if k not in RETIRED[name]} if name in RETIRED else fields
            for name, fields in tree.items()}
    try:
        kinds = {f.name: type(getattr(Config(), f.name)) for f in dataclasses.fields(Config)}
        unknown = sorted(set(tree) - set(kinds))
        if unknown:
            raise ConfigError(f"unknown config section {unknown[0]!r}{nearest_key(known_keys(Config()), unknown[0])}")
        return validate(Config(**{name: kind(**tree.get(name, {})) for name, kind in kinds.items()}))
    except TypeError as e:
        raise ConfigError(str(e)) from None
