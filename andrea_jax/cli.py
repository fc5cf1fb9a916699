"""Command line: python train.py --config NAME_OR_PATH --workdir DIR [--set section.key=value ...]

A population of small models trains in one process when each member is given as `--member NAME
[SECTION.KEY=VALUE ...]` (its run folder WORKDIR/NAME, then its own overrides after --set's):
andrea_jax.train.population_loop, docs/POPULATIONS.md.

Several processes (hosts) train one model when each is started with the same --coordinator and
--num-processes and its own --process-id (or with --distributed on a cluster that JAX detects,
such as SLURM). On CPU the processes talk over gloo.

Exit codes: 0 done; 2 the command or config asks for something impossible (fix it and rerun);
1 the run failed (data, checkpoints, a non-finite loss, a busy workdir); 128 + N stopped by signal
N (143 SIGTERM, 130 SIGINT) after saving a checkpoint: the run is not finished, rerun the same
command to continue. A signal before training starts, or a second one, stops it without a
checkpoint: "error: interrupted" (SIGINT) or "error: terminated" (SIGTERM), same codes; the second
one stops it at once, whatever it is doing. Every error is one line on stderr; --debug shows the
traceback instead.
"""
from __future__ import annotations

import argparse
import os
import sys

from andrea_jax import config as config_lib, configs, signals, startup
from andrea_jax.errors import AndreaError, ConfigError, MissingExtraError


def start_distributed(args) -> None:
    import jax
    # CPU processes need a collectives backend; GPU runs use NCCL and ignore this setting.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if args.coordinator:
        jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes,
                                   process_id=args.process_id)
    else:
        jax.distributed.initialize()


@signals.command  # a second SIGINT or SIGTERM stops the process at once, whatever it is doing
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="a name in configs/ or a path to a .py config (not with --fork-from)")
    parser.add_argument("--fork-from", metavar="RUN@STEP",
                        help="a WSD cooldown of --set optim.decay_steps=K steps from RUN's stable-phase checkpoint "
                             "STEP, into the new --workdir (train/fork.py); RUN is only read")
    parser.add_argument("--workdir", required=True, help="folder for metrics, checkpoints, tokenizer, config")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config field; repeatable")
    parser.add_argument("--member", action="append", nargs="+", default=[], metavar=("NAME", "SECTION.KEY=VALUE"),
                        help="one member of a population trained by one vmapped step: its run folder WORKDIR/NAME, "
                             "then its own overrides (after --set's); repeat per member (docs/POPULATIONS.md)")
    parser.add_argument("--coordinator", help="HOST:PORT of process 0, for a multi-process run")
    parser.add_argument("--num-processes", type=int, help="number of processes (with --coordinator)")
    parser.add_argument("--process-id", type=int, help="this process's index (with --coordinator)")
    parser.add_argument("--distributed", action="store_true",
                        help="initialise jax.distributed from the cluster's environment")
    parser.add_argument("--allow-schedule-change", action="store_true",
                        help="resume although train.steps or an optim.* setting changed (re-stretches the LR schedule)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error, not one line")
    args = parser.parse_args(argv)
    if args.coordinator and (args.num_processes is None or args.process_id is None):
        parser.error("--coordinator needs --num-processes and --process-id")
    if (args.config is None) == (args.fork_from is None):
        parser.error("give --config, or --fork-from (the fork's config is its parent's)")
    if args.fork_from and (args.coordinator or args.distributed):
        parser.error("--fork-from prepares the new workdir in one process: fork with one, then resume with several")
    if args.member and (args.fork_from or args.coordinator or args.distributed):
        parser.error("--member trains a population in one process, from --config")
    if args.debug:
        return run(args)
    try:
        return run(args)
    except AndreaError as e:  # a config (exit 2), data, workdir, checkpoint or training error
        config = isinstance(e, ConfigError) and not isinstance(e, MissingExtraError)  # an install is no config
        return fail(f"{'config error' if config else 'error'}: {e}", e.exit_code)
    except Exception as e:
        return fail(f"error: {type(e).__name__}: {e} (--debug shows where)", 1)


def fail(message: str, code: int) -> int:
    print(" ".join(message.split()), file=sys.stderr)  # one line, whatever the message holds
    return code


def run(args) -> int:
    """Trains one run, or with --member a population: `runs` is [(folder, config, its --set)], the
    workdir itself for a solo run."""
    if args.fork_from:
        startup.import_jax()
        from andrea_jax.train import fork
        runs = [(args.workdir, fork.prepare(args.fork_from, args.workdir, args.set), args.set)]
    else:
        base = configs.load(args.config)
        members = [(name, [*args.set, *sets]) for name, *sets in args.member] or [(None, args.set)]
        runs = [(args.workdir if name is None else os.path.join(args.workdir, name), validated(base, sets, name), sets)
                for name, sets in members]
    if runs[0][1].train.deterministic:  # read by XLA once, when jax first starts a backend
        os.environ["XLA_FLAGS"] = startup.with_deterministic_flags(os.environ.get("XLA_FLAGS", ""))
    startup.import_jax()
    from andrea_jax.train import budget  # imports jax (through workdir): after import_jax, which keeps it quiet
    # once, before anything compiles
    cfgs = [budget.resolve(cfg, explicit=sets, workdir=folder) for folder, cfg, sets in runs]
    if args.coordinator or args.distributed:
        start_distributed(args)
    startup.start_jax()
    budget.announce(cfgs[0])
    from andrea_jax.serve import generate
    # after validation: a bad config fails before jax starts work
    from andrea_jax.train import loop, population_loop, preemption
    extra_hooks = training_hooks(cfgs[0])  # reads train.eval_tasks: a bad task file fails before training
    common = dict(allow_schedule_change=args.allow_schedule_change, at_end=generate.closing_sample,
                  extra_hooks=extra_hooks)
    try:
        if args.member:
            population_loop.train(list(zip([name for name, *_ in args.member], cfgs)), args.workdir, **common)
        else:
            loop.train(cfgs[0], args.workdir, **common)
    except preemption.Stopped as e:
        print(e, file=sys.stderr, flush=True)
        return e.exit_code
    return 0


def validated(base: config_lib.Config, sets: list[str], member: str | None) -> config_lib.Config:
    """`base` with the overrides, validated; a member's error names the member."""
    try:
        return config_lib.validate(config_lib.override(base, sets))
    except ConfigError as e:
        if member is None or isinstance(e, MissingExtraError):
            raise
        raise ConfigError(f"--member {member}: {e}") from None


def training_hooks(cfg: config_lib.Config) -> tuple:
    """train.eval_tasks as a hook of the training loop (none without tasks): at every evaluation,
    the tasks scored on the current parameters by the code of `evaluate --task` (the same numbers
    as on that step's checkpoint), as {task/NAME/METRIC: value}. The task files are read here, so
    a bad one fails before the loop tokenizes anything. Composed here, where the command meets both:
    serve scores, train runs hooks, and neither imports the other."""
    from andrea_jax.serve import load, tasks
    from andrea_jax.train import hooks, loop
    read = tasks.read_training_tasks(cfg)
    if not read:
        return ()

    def score_tasks(ctx: hooks.Context, state: hooks.LoopState, step: int, line) -> dict:
        loaded = load.LoadedModel(ctx.cfg, state.train.params, ctx.corpus.tokenizer, step, str(ctx.run_dir.root))
        return tasks.score_tasks(loaded, read)

    return (hooks.Hook("tasks", loop.at_eval(cfg), score_tasks),)


if __name__ == "__main__":
    sys.exit(main())
