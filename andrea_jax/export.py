"""`python -m andrea_jax.export`, the same command as `andrea-export`; its code is andrea_jax.serve.export."""
import sys

from andrea_jax import commands

if __name__ == "__main__":
    sys.exit(commands.export())
