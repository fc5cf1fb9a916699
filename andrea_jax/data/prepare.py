"""`python -m andrea_jax.data.prepare`, the same command as `andrea-prepare`; the Beam pipeline is andrea_jax.data.beam_prepare."""
import sys

from andrea_jax import commands

if __name__ == "__main__":
    sys.exit(commands.prepare())
