"""Batch and sequence-length ramps (train.batch_ramp, model.seq_len_ramp), and the clock every
schedule reads.

A ramp is a few stages, each a size used until a count of tokens seen. The `plan` of a config is
its steps cut into segments of one (batch, seq_len) shape each, the last endless at the full shape;
it is a pure function of the config, so the tokens seen before any step (`tokens_at`) follow from
the step alone, and a run resumed at a step needs no other state to be where it was. Each distinct
shape is compiled once (`shapes`: at most one per stage of either ramp, plus the full one).

**The clock.** Without a ramp every schedule (the LR's warmup and decay, ProRes's T) counts steps.
With one it counts tokens seen, in units of one step of the full shape (train.batch_size x
model.seq_len tokens), so the schedules' settings keep their meaning in steps of the full shape:
`clock(cfg, step)` is tokens_at(step) / (train.batch_size x model.seq_len), a float32 that equals
the step whenever every step is of the full shape. The evaluation and checkpoint cadence counts the
same way (`crosses`). Pure functions, jittable in the step (`clock`).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax.numpy as jnp

from andrea_jax.config_text import parse_ramp


class Segment(NamedTuple):
    first_step: int         # the count of completed steps before the segment's first step
    tokens: int             # tokens seen before its first step
    batch: int              # its global batch, in sequences
    seq_len: int            # its sequence length
    steps: int | None       # how many steps it lasts; None: the last, endless


def ramped(cfg) -> bool:
    return bool(cfg.train.batch_ramp or cfg.model.seq_len_ramp)


def full_tokens(cfg) -> int:
    """Tokens of one step of the full shape: the clock's unit."""
    return cfg.train.batch_size * cfg.model.seq_len


def _size_at(stages: list[tuple[int, int]], full: int, tokens: int) -> tuple[int, int | None]:
    """(the size in use after `tokens` tokens, the token count at which it ends; None: never)."""
    return next(((size, end) for size, end in stages if tokens < end), (full, None))


@functools.lru_cache(maxsize=None)
def plan(cfg) -> tuple[Segment, ...]:
    """The run's segments of one shape, in order; one endless segment of the full shape without a ramp."""
    batches = parse_ramp("train.batch_ramp", cfg.train.batch_ramp)
    lengths = parse_ramp("model.seq_len_ramp", cfg.model.seq_len_ramp)
    segments, step, tokens = [], 0, 0
    while True:
        batch, batch_end = _size_at(batches, cfg.train.batch_size, tokens)
        length, length_end = _size_at(lengths, cfg.model.seq_len, tokens)
        ends = [e for e in (batch_end, length_end) if e is not None]
        # A stage's last step may run past its end by less than one step: a step has one shape.
        steps = -(-(min(ends) - tokens) // (batch * length)) if ends else None
        if segments and segments[-1][2:4] == (batch, length):   # a stage of the size already in use
            last = segments.pop()
            step, tokens = last.first_step, last.tokens
            steps = None if steps is None else steps + last.steps
        segments.append(Segment(step, tokens, batch, length, steps))
        if steps is None:
            return tuple(segments)
        step, tokens = step + steps, tokens + steps * batch * length


def segment(cfg, step: int) -> Segment:
    """The segment of the step after `step` completed ones."""
    return next(s for s in reversed(plan(cfg)) if s.first_step <= step)


def tokens_at(cfg, step: int) -> int:
    """Tokens seen in the first `step` steps (exact)."""
    s = segment(cfg, step)
    return s.tokens + (step - s.first_step) * s.batch * s.seq_len


def shape_at(cfg, step: int) -> tuple[int, int]:
    """(batch, seq_len) of the step after `step` completed ones."""
    s = segment(cfg, step)
    return s.batch, s.seq_len


def steps_for_tokens(cfg, tokens: int) -> int:
    """The fewest steps that see at least `tokens` tokens."""
    s = next(s for s in plan(cfg) if s.steps is None or s.tokens + s.steps * s.batch * s.seq_len >= tokens)
    return s.first_step + max(0, -(-(tokens - s.tokens) // (s.batch * s.seq_len)))


def shapes(cfg, steps: int | None = None) -> list[tuple[int, int]]:
    """The distinct (batch, seq_len) shapes of the first `steps` steps (default train.steps), in order."""
    steps = cfg.train.steps if steps is None else steps
    return list(dict.fromkeys((s.batch, s.seq_len) for s in plan(cfg) if s.first_step < steps))


def clock(cfg, step):
    """float32: what the schedules read after `step` completed steps (a traced step inside jit): the
    step itself without a ramp; with one, the tokens seen over full_tokens(cfg)."""
    if not ramped(cfg):
        return jnp.asarray(step, jnp.float32)
    segments, full = plan(cfg), full_tokens(cfg)
    step = jnp.asarray(step, jnp.int32)
    first_S = jnp.asarray([s.first_step for s in segments], jnp.int32)
    start_S = jnp.asarray([s.tokens / full for s in segments], jnp.float32)
    rate_S = jnp.asarray([s.batch * s.seq_len / full for s in segments], jnp.float32)
    k = jnp.sum(step[..., None] >= first_S[1:], axis=-1)   # the segment of each step (any shape of steps)
    return start_S[k] + (step - first_S[k]).astype(jnp.float32) * rate_S[k]


def total(cfg) -> float:
    """The clock at the run's last step, train.steps: where the LR schedule ends."""
    return tokens_at(cfg, cfg.train.steps) / full_tokens(cfg) if ramped(cfg) else cfg.train.steps


def crosses(cfg, step: int, every: int) -> bool:
    """Whether `step` is due under a cadence of `every` (0: never): without a ramp every `every`
    steps; with one, the step whose tokens pass a multiple of `every` full-shape steps' tokens."""
    if not every:
        return False
    unit = every * full_tokens(cfg)
    return tokens_at(cfg, step) // unit > tokens_at(cfg, step - 1) // unit if ramped(cfg) else step % every == 0


def describe(cfg) -> str:
    """One line: the shapes a ramped run steps through, each from its first step; '' without a ramp."""
    if not ramped(cfg):
        return ""
    stages = ", ".join(f"{s.batch}x{s.seq_len} from step {s.first_step + 1} ({s.tokens:,} tokens)"
                       for s in plan(cfg) if s.first_step < cfg.train.steps)
    return (f"ramp: {len(shapes(cfg))} step shape(s) (batch x seq_len), one compile each: {stages}; "
            f"schedules count tokens seen, in steps of {full_tokens(cfg):,} tokens")
