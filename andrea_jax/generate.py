"""`python -m andrea_jax.generate`, the same command as `andrea-generate`; its code is andrea_jax.serve.generate."""
import sys

from andrea_jax import commands

if __name__ == "__main__":
    sys.exit(commands.generate())
