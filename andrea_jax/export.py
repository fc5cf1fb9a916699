"""`python -m andrea_jax.export`, the command the README has always given; the code is andrea_jax.serve.export."""
import sys

from andrea_jax.serve.export import main

if __name__ == "__main__":
    sys.exit(main())
