"""`python -m andrea_jax.evaluate`, the command the README has always given; the code is andrea_jax.serve.evaluate."""
import sys

from andrea_jax.serve.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
