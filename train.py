"""Command line: python train.py --config NAME_OR_PATH --workdir DIR [--set section.key=value ...]

Several processes (hosts) train one model when each is started with the same --coordinator and
--num-processes and its own --process-id (or with --distributed on a cluster that JAX detects,
such as SLURM). On CPU the processes talk over gloo.
"""
from __future__ import annotations

import argparse
import sys

from andrea_jax import config as config_lib


def start_distributed(args) -> None:
    import jax
    # CPU processes need a collectives backend; GPU runs use NCCL and ignore this setting.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if args.coordinator:
        jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes,
                                   process_id=args.process_id)
    else:
        jax.distributed.initialize()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a name in configs/ or a path to a .py config")
    parser.add_argument("--workdir", required=True, help="folder for metrics, checkpoints, tokenizer, config")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config field; repeatable")
    parser.add_argument("--coordinator", help="HOST:PORT of process 0, for a multi-process run")
    parser.add_argument("--num-processes", type=int, help="number of processes (with --coordinator)")
    parser.add_argument("--process-id", type=int, help="this process's index (with --coordinator)")
    parser.add_argument("--distributed", action="store_true",
                        help="initialise jax.distributed from the cluster's environment")
    args = parser.parse_args(argv)
    if args.coordinator and (args.num_processes is None or args.process_id is None):
        parser.error("--coordinator needs --num-processes and --process-id")
    try:
        cfg = config_lib.validate(config_lib.override(config_lib.load(args.config), args.set))
    except config_lib.ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2

    if args.coordinator or args.distributed:
        start_distributed(args)
    from andrea_jax import trainer  # after validation: a bad config fails before jax starts work
    from andrea_jax.checkpoint import CheckpointError
    from andrea_jax.data.pipeline import DataError
    try:
        trainer.train(cfg, args.workdir)
    except (DataError, CheckpointError, trainer.TrainingError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
