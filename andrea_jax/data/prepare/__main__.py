"""`python -m andrea_jax.data.prepare`: the same function as the console script `andrea-prepare`."""
import sys

from andrea_jax.data.prepare.driver import main

if __name__ == "__main__":
    sys.exit(main())
