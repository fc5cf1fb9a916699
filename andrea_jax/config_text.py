"""Settings given as text (`--set section.key=value`): a value parsed by its field's type, and the
known key nearest to a mistyped one. Knows nothing of the config's sections (config.py passes them)."""
from __future__ import annotations

import difflib

from andrea_jax.errors import ConfigError

_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def parse_value(key: str, text: str, kind: type):
    try:
        if kind is bool:
            return _BOOLS[text.lower()]
        return int(text.replace("_", "")) if kind is int else kind(text)
    except (KeyError, ValueError):
        raise ConfigError(f"{key}: expected {kind.__name__}, got {text!r}") from None


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
