"""`python -m andrea_jax.evaluate`, the same command as `andrea-evaluate`; its code is andrea_jax.serve.evaluate."""
import sys

from andrea_jax import commands

if __name__ == "__main__":
    sys.exit(commands.evaluate())
