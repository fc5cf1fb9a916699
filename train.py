"""Command line: python train.py --config NAME_OR_PATH --workdir DIR [--set section.key=value ...]"""
from __future__ import annotations

import argparse
import sys

from andrea_jax import config as config_lib


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="a name in configs/ or a path to a .py config")
    parser.add_argument("--workdir", required=True, help="folder for metrics.jsonl, tokenizer, config")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config field; repeatable")
    args = parser.parse_args(argv)
    try:
        cfg = config_lib.validate(config_lib.override(config_lib.load(args.config), args.set))
    except config_lib.ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2

    from andrea_jax import trainer  # after validation: a bad config fails before jax starts work
    from andrea_jax.data.pipeline import DataError
    try:
        trainer.train(cfg, args.workdir)
    except (DataError, trainer.TrainingError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
