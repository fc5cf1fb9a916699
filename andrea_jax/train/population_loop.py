"""Training a population (andrea_jax.train.population) as its members' solo runs are trained:

    python train.py --config tiny --workdir runs/pop --member a optim.lr=1e-3 --member b optim.lr=3e-3 train.seed=1

Each member has its own run folder, WORKDIR/NAME, written as a solo run writes its own
(andrea_jax/workdir.py): config.json (the member's config), tokenizer.json, metrics.jsonl,
step_losses.npy, TensorBoard events and checkpoints in the solo format (andrea_jax/checkpoint.py),
whose train state is the member's slice of the population's. So a member folder is exported,
evaluated and sampled as any run, and `train.py --workdir WORKDIR/NAME` with the member's settings
continues it alone. A population resumes from its members' checkpoints at the newest step that all
of them can restore, and continues bit for bit.

One process steps every member with one vmapped step on one batch stream. What a step owes a
member is the solo loop's list (loop.step_hooks: checkpoint, metric line, evaluation, extra hooks,
spike score), run member after member with that member's hooks.Context and hooks.LoopState; the
diagnostics steps are the population's own (population.make_train_step with_diagnostics). A
member's line holds the solo line's keys and `frozen`: 1 once the member met a non-finite loss or
update, after which its state stays as it was (its checkpoints keep its last finite state, and its
later lines its loss there). The run fails only when every member is frozen, where a solo run fails
at its first non-finite loss. `mfu` in a member's line is the member's share of the devices.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import re
import sys
from typing import NamedTuple, Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec as P
from tqdm import tqdm

from andrea_jax import checkpoint
from andrea_jax.config import Config
from andrea_jax.data import pipeline, tokenizer as tokenizer_lib
from andrea_jax.errors import CheckpointError, ConfigError, ResumeError, TrainingError
from andrea_jax.train import hooks, loop, population, preemption, profiling, steps
from andrea_jax.train.sharding import batch_spec
from andrea_jax.workdir import Workdir

SETTING = re.compile(r"^[a-z_]+\.[a-z_0-9]+=")  # `section.key=value`: a setting, never a member's name


def check_members(names: Sequence[str], cfgs: Sequence[Config]) -> None:
    """ConfigError unless the members can train together: distinct folder names that are no
    settings, and configs a population takes (population.check_structure)."""
    for name in names:
        if not name or SETTING.match(name):
            raise ConfigError(f"--member {name!r}: a member starts with its folder's name (WORKDIR/NAME), "
                              "then its section.key=value settings")
    if len(set(names)) < len(names):
        raise ConfigError(f"--member: two members share a folder name ({', '.join(names)})")
    population.check_structure(list(cfgs))
    if cfgs[0].train.init_from:
        raise ConfigError("train.init_from: a population's members start from their own train.seed")
    if cfgs[0].diagnostics.wandb:
        raise ConfigError("diagnostics.wandb: W&B keeps one run per process; a population's members log to "
                          "their folders' metrics.jsonl and TensorBoard")


def train(members: Sequence[tuple[str, Config]], workdir: str | pathlib.Path, *, show_progress: bool = True,
          allow_schedule_change: bool = False, at_end: loop.AtEnd | None = None,
          extra_hooks: Sequence[hooks.Hook] = ()) -> dict[str, list[dict]]:
    """Trains the members, each (NAME, config) in WORKDIR/NAME, resuming where their checkpoints
    are; returns each member's metric lines written by this call, by name. Raises as loop.train
    does; TrainingError only when every member is frozen. at_end and extra_hooks are called per
    member, as loop.train calls them."""
    names, cfgs = [name for name, _ in members], [cfg for _, cfg in members]
    check_members(names, cfgs)
    loop.check_deterministic(cfgs[0])
    dirs = [Workdir(pathlib.Path(workdir) / name).create() for name in names]
    with contextlib.ExitStack() as held:
        for run_dir in dirs:
            held.enter_context(run_dir.held())
        ckpts = [held.enter_context(checkpoint.manager(d.root, max_to_keep=c.train.keep_checkpoints))
                 if c.train.checkpoint_every else None for d, c in zip(dirs, cfgs)]
        return _train(names, cfgs, dirs, ckpts, show_progress, allow_schedule_change, at_end, extra_hooks)


class Setup(NamedTuple):
    """What set-up made ready: as loop.Run's, with the population's state and each member's losses."""
    mesh: jax.sharding.Mesh
    corpus: pipeline.TokenizedCorpus
    batches: object
    val: list
    to_global: object
    eot: int
    state: population.PopulationState
    start: int
    step_losses: list             # per member: the loss of every step up to `start`


def _set_up(cfgs: list[Config], dirs: list[Workdir], ckpts: list, allow_schedule_change: bool) -> Setup:
    """loop._set_up for the members: one mesh and batch stream, a fresh population or the
    members' checkpoints stacked, and each member's config.json and tokenizer.json."""
    cfg = cfgs[0]
    profiling.use_compile_cache(cfg.train.compile_cache)
    mesh = steps.make_mesh(cfg)
    for run_dir, member_cfg, ckpt in zip(dirs, cfgs, ckpts):
        if ckpt is not None and ckpt.latest_step() is not None:
            run_dir.check_resume(member_cfg, allow_schedule_change=allow_schedule_change)
    corpus, batches, val = pipeline.build(cfg, dirs[0].root)
    for run_dir in dirs[1:]:
        corpus.tokenizer.save(str(run_dir.tokenizer))
    rows = NamedSharding(mesh, batch_spec(cfg, mesh))
    to_global = lambda local: jax.make_array_from_process_local_data(rows, local)
    state, start, step_losses = population.create_states(cfgs, mesh), 0, [[] for _ in cfgs]
    restored = _restore(cfgs, ckpts, mesh) if ckpts[0] is not None else None
    if restored:
        pipeline.set_state(batches, cfg, corpus, restored[0].data_state,
                           where=f"the data state of checkpoint {ckpts[0].directory}/{restored[0].step}")
        start, step_losses = restored[0].step, [r.step_losses for r in restored]
        state = _stacked(cfg, mesh, state.settings, [r.state for r in restored], start)
    if jax.process_index() == 0:
        for run_dir, member_cfg in zip(dirs, cfgs):
            run_dir.config.write_text(json.dumps(member_cfg.to_dict(), indent=2))
    return Setup(mesh, corpus, batches, val, to_global, tokenizer_lib.eot_id(corpus.tokenizer), state, start,
                 step_losses)


def _restore(cfgs: list[Config], ckpts: list, mesh) -> list[checkpoint.Restored] | None:
    """Every member's checkpoint at the newest step that all of them hold and can restore, each
    read into a solo train state; None when no member has a checkpoint."""
    held = [set(ckpt.all_steps()) for ckpt in ckpts]
    if not any(held):
        return None
    for step in sorted(set.intersection(*held), reverse=True):
        try:
            return [checkpoint.restore_newest_readable(ckpt, steps.abstract_state(c, mesh), among=(step,))
                    for ckpt, c in zip(ckpts, cfgs)]
        except CheckpointError as e:
            print(f"warning: {e}; trying the members' previous common step", file=sys.stderr, flush=True)
    raise ResumeError("a population resumes its members together, from a step all of them can restore, and "
                      "there is none: " + "; ".join(f"{c.directory} holds {sorted(h) or 'none'}"
                                                    for c, h in zip(ckpts, held))
                      + "; move the checkpoints away to start afresh, or train the members alone")


def _stacked(cfg: Config, mesh, settings: population.MemberSettings, states: list, start: int):
    """The members' restored train states as one PopulationState; a member whose step stopped
    short of the checkpoint's was frozen."""
    def stack(trees):
        step = jax.numpy.stack([t.step for t in trees])
        on_top = lambda *leaves: jax.numpy.stack(leaves)
        return population.PopulationState(
            step=step, params=jax.tree.map(on_top, *[t.params for t in trees]),
            opt_state=jax.tree.map(on_top, *[t.opt_state for t in trees]), settings=settings, frozen=step != start)
    return jax.jit(stack, out_shardings=population.state_shardings(cfg, mesh))(states)


class _MemberBar:
    """The population's progress bar as a member's hooks see it: what they print names the member."""

    def __init__(self, bar, name: str):
        self.bar, self.name = bar, name

    def write(self, text: str, **kwargs) -> None:
        self.bar.write(f"{self.name}: {text}", **kwargs)

    def __getattr__(self, attr):
        return getattr(self.bar, attr)


def _contexts(names, cfgs, dirs, ckpts, setup: Setup, bar) -> list[hooks.Context]:
    """Each member's hooks.Context (loop.context's), sharing the bar and, between members of one
    ProRes setting, the compiled evaluation steps."""
    out, shared = [], {}
    for name, cfg, run_dir, ckpt, losses in zip(names, cfgs, dirs, ckpts, setup.step_losses):
        run = loop.Run(run_dir, ckpt, setup.mesh, setup.corpus, setup.batches, setup.val, setup.to_global,
                       setup.eot, None, setup.start, losses)
        ctx = loop.context(cfg, run, show_progress=False)
        ctx.bar.close()
        eval_step, knockout_step = shared.setdefault(cfg.prores, (ctx.eval_step, ctx.knockout_step))
        out.append(dataclasses.replace(ctx, bar=_MemberBar(bar, name), eval_step=eval_step,
                                       knockout_step=knockout_step))
    return out


class _Members:
    """The members' train states cut from the population's, each a solo TrainState."""

    def __init__(self, cfgs: list[Config], mesh):
        self.abstract = [steps.abstract_state(cfg, mesh) for cfg in cfgs]
        solo = steps.state_shardings(cfgs[0], mesh)
        self.take = jax.jit(population.member, out_shardings=(NamedSharding(mesh, P()), solo.params, solo.opt_state))

    def __call__(self, state: population.PopulationState, i: int):
        step, params, opt_state = self.take(state, i)
        return self.abstract[i].replace(step=step, params=params, opt_state=opt_state)


def _train(names, cfgs, dirs, ckpts, show_progress, allow_schedule_change, at_end, extra_hooks) -> dict:
    cfg = cfgs[0]
    setup = _set_up(cfgs, dirs, ckpts, allow_schedule_change)
    bar = tqdm(total=cfg.train.steps, initial=setup.start, disable=not show_progress or jax.process_index() != 0,
               dynamic_ncols=True)
    ctxs = _contexts(names, cfgs, dirs, ckpts, setup, bar)
    members = _Members(cfgs, setup.mesh)
    # a resumed member's spikes are reported already
    states = [hooks.LoopState(None, last_step=setup.start,
                              spikes_seen=hooks.latest_spike(members(setup.state, i).opt_state)[0])
              for i in range(len(cfgs))]
    step_fns = tuple(population.make_train_step(cfgs, setup.mesh, with_diagnostics=d, eot_id=setup.eot)
                     for d in (False, bool(cfg.diagnostics.every)))
    stop = preemption.StopRequests().install()  # uninstalled in the finally below
    n_params = sum(int(p.size) for p in jax.tree.leaves(setup.state.params)) // len(cfgs)
    print(f"ANDREA population: {len(cfgs)} members of {n_params:,} parameters in {dirs[0].root.parent}, "
          f"{setup.corpus.train_size}, {jax.device_count()} {jax.devices()[0].platform} device(s)"
          + (f", resumed at step {setup.start}" if setup.start else ""), flush=True)
    run = _Run(setup.state, [])
    with jax.set_mesh(setup.mesh):
        try:
            _steps(ctxs, states, run, members, step_fns, setup.to_global, stop,
                   loop.step_hooks(cfg, has_checkpoints=ckpts[0] is not None, extra=extra_hooks))
        finally:
            stop.uninstall()
            _close(ctxs, states, run)
            bar.close()
        if at_end is not None:
            for i, (member_cfg, run_dir) in enumerate(zip(cfgs, dirs)):
                at_end(member_cfg, run_dir, members(run.state, i), setup.corpus.tokenizer,
                       has_checkpoint=ckpts[0] is not None)
    return {name: st.lines for name, st in zip(names, states)}


@dataclasses.dataclass
class _Run:
    state: population.PopulationState
    pending: list                 # (loss [N], frozen [N]) of each step since the last wait, on the device
    said_frozen: set = dataclasses.field(default_factory=set)  # the members named frozen on stderr


def _steps(ctxs, states, run: _Run, members: _Members, step_fns, to_global, stop, step_hooks) -> None:
    """loop._steps for the population: one step of every member on the next batch; where something
    is due, the wait (`_sync`), then for each member its due hooks, merged into its line."""
    cfg, diagnoses = ctxs[0].cfg, loop.at_diagnostics(ctxs[0].cfg)
    trace = profiling.StepTrace(cfg.train.profile, ctxs[0].run_dir.root.parent / "profile")
    try:
        for step in range(states[0].last_step + 1, cfg.train.steps + 1):
            due = [hook for hook in step_hooks if hook.due(step)]
            trace.before(step)
            run.state, metrics = step_fns[diagnoses(step)](run.state, to_global(next(ctxs[0].batches)))
            trace.after(step, run.state)
            run.pending.append((metrics["loss"], metrics["frozen"]))
            signum = stop.agreed(at_sync_point=bool(due))
            if signum:
                due = [hook for hook in step_hooks if hook in due or hook.on_stop]
            if not (due or signum):
                continue
            _sync(ctxs, run, step)
            for i, (ctx, st) in enumerate(zip(ctxs, states)):
                st.train, st.step_metrics = members(run.state, i), {k: v[i] for k, v in metrics.items()}
                loop._report_spikes(ctx, st)
                line = loop.run_hooks(ctx, st, step, due)
                if any(hook.writes_line for hook in due):
                    loop._write_line(ctx, st, step, line)
                st.train = None  # a copy of the member's slice: the population's state is the one kept
            if signum:
                where = f"{ctxs[0].run_dir.root.parent}/MEMBER/checkpoints/{step}" if ctxs[0].ckpt else None
                raise preemption.Stopped(signum, step, where)
    finally:
        trace.close()


def _drain(ctxs, run: _Run) -> list:
    """The (loss, frozen) pairs pending since the last wait, fetched once; each member's losses join
    its step_losses."""
    host = jax.device_get(run.pending)
    run.pending.clear()
    for i, ctx in enumerate(ctxs):
        ctx.metrics.step_losses += [float(loss[i]) for loss, _ in host]
    return host


def _sync(ctxs, run: _Run, step: int) -> None:
    """Waits for the devices: each member's losses since the last wait join its step_losses, a
    member newly frozen is named on stderr with its step, and TrainingError is raised once every
    member is frozen."""
    host = _drain(ctxs, run)
    frozen = [bool(f) for f in host[-1][1]]
    for i in sorted({i for i, f in enumerate(frozen) if f} - run.said_frozen):
        run.said_frozen.add(i)  # its step stopped at the update it refused
        ctxs[i].bar.write(f"warning: frozen from step {int(jax.device_get(run.state.step[i])) + 1} on by a non-finite "
                          "loss or update; its state stays as it was, and its checkpoints keep it", file=sys.stderr)
    if all(frozen):
        raise TrainingError(f"every member of the population is frozen by a non-finite loss or update at step "
                            f"{step}; {ctxs[0].where}")


def _close(ctxs, states, run: _Run) -> None:
    """loop._close for every member, the losses since the last wait kept too."""
    _drain(ctxs, run)
    for ctx, st in zip(ctxs, states):
        loop._close(ctx, st)
