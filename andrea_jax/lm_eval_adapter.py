"""`python -m andrea_jax.lm_eval_adapter`, the command the README has always given; the code is andrea_jax.serve.lm_eval_adapter."""
import sys

from andrea_jax.serve.lm_eval_adapter import main

if __name__ == "__main__":
    sys.exit(main())
