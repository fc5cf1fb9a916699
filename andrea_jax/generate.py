"""`python -m andrea_jax.generate`, the command the README has always given; the code is andrea_jax.serve.generate."""
import sys

from andrea_jax.serve.generate import main

if __name__ == "__main__":
    sys.exit(main())
