"""`python -m andrea_jax.data.prepare`, the README's command; the Beam pipeline is andrea_jax.data.beam_prepare."""
import sys

from andrea_jax.data.beam_prepare import main

if __name__ == "__main__":
    sys.exit(main())
