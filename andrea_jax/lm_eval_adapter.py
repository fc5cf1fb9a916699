"""`python -m andrea_jax.lm_eval_adapter`, the same command as `andrea-lm-eval`; its code is andrea_jax.serve.lm_eval_adapter."""
import sys

from andrea_jax import commands

if __name__ == "__main__":
    sys.exit(commands.lm_eval())
