"""The console scripts (pyproject.toml), in one place.

Each starts jax the way andrea_jax/startup.py says (quietly where the CUDA plugin has no driver)
before it imports its command's module, since those modules import jax at their top. The
`python -m andrea_jax.serve.NAME` forms start it the same way, in a guard at the top of each such
module, above the imports that import jax.
"""
from __future__ import annotations

from andrea_jax import startup


def train() -> int:
    from andrea_jax import cli  # cli starts jax itself: jax.distributed may need to come first
    return cli.main()


def export() -> int:
    startup.start_jax()
    from andrea_jax.serve import export as command
    return command.main()


def average() -> int:
    startup.start_jax()
    from andrea_jax.serve import average as command
    return command.main()


def generate() -> int:
    startup.start_jax()
    from andrea_jax.serve import generate as command
    return command.main()


def evaluate() -> int:
    startup.start_jax()
    from andrea_jax.serve import evaluate as command
    return command.main()


def lm_eval() -> int | None:
    startup.start_jax()
    from andrea_jax.serve import lm_eval_adapter as command
    return command.main()


def prepare() -> int:
    from andrea_jax.data.prepare import driver as command  # tokenizers and Beam: no jax
    return command.main()


def aot() -> int:
    from andrea_jax.aot import __main__ as command  # starts jax itself, with the plugin registered for its targets
    return command.main()
