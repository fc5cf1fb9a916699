"""python train.py --config NAME_OR_PATH --workdir DIR [--set section.key=value ...] [--member NAME [SET ...] ...]

The training command; its code is andrea_jax.cli, also installed as `andrea-train`.
"""
import sys

from andrea_jax.cli import main

if __name__ == "__main__":
    sys.exit(main())
