"""The step loop's contract with its hooks, on a fake run that compiles nothing: the loop goes by
a hook's flags (`on_stop`, `writes_line`), never its name; a hook's result reaches the hooks after
it at the same step, read-only; the step line holds a skipped loss spike until a line has it."""
import dataclasses
import operator
import signal
import types

import numpy as np
import pytest

from andrea_jax import config as config_lib
from andrea_jax.errors import TrainingError
from andrea_jax.train import hooks, loop as trainer, optim, preemption


class Bar:
    n = 0

    def __init__(self):
        self.written = []

    def write(self, text, file=None):
        self.written.append(text)

    def set_postfix(self, postfix):
        pass

    def update(self, k):
        self.n += k

    def close(self):
        pass


class StopAt:
    """A signal that arrives during step `step` (0: none)."""

    def __init__(self, step):
        self.step, self.asked = step, 0

    def agreed(self, *, at_sync_point):
        self.asked += 1
        return signal.SIGTERM if self.asked == self.step else 0


def fake_run(tmp_path, steps):
    cfg = config_lib.Config()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=steps, profile=""),
                              diagnostics=dataclasses.replace(cfg.diagnostics, every=0))
    written = []
    ctx = hooks.Context(cfg=cfg, run_dir=types.SimpleNamespace(root=tmp_path), ckpt=None,
                        batches=iter(np.zeros((steps, 1, 2), np.int32)), corpus=None, val=[], eval_step=None,
                        bytes_per_token_V=None, metrics=types.SimpleNamespace(step_losses=[], write=written.append),
                        bar=Bar())
    state = hooks.LoopState(types.SimpleNamespace(opt_state=()), last_step=0)
    step_fn = lambda train, batch: (train, {"loss": np.float32(1.0)})
    return ctx, state, (step_fn, step_fn), written


def record(ran, name, out=None):
    def fn(ctx, state, step, line):
        ran.append((name, step))
        return dict(out or {})
    return fn


def test_the_loop_goes_by_a_hook_s_flags_not_its_name(tmp_path):
    ctx, state, step_fns, written = fake_run(tmp_path, steps=6)
    ran = []
    step_hooks = [hooks.Hook("save", 0, record(ran, "save"), on_stop=True),
                  hooks.Hook("checkpoint", 0, record(ran, "checkpoint")),  # the names the loop once went by
                  hooks.Hook("line", 2, lambda ctx, state, step, line: {"step": step}, writes_line=True),
                  hooks.Hook("log", 3, record(ran, "log", {"log": True}))]
    with pytest.raises(preemption.Stopped) as stopped:
        trainer._steps(ctx, state, step_fns, lambda rows: rows, StopAt(5), step_hooks)
    assert stopped.value.step == 5 and stopped.value.signum == signal.SIGTERM
    assert ran == [("log", 3), ("save", 5)]  # the stop runs the on_stop hook only; "checkpoint" never runs
    assert written == state.lines == [{"step": 2}, {"step": 4}]  # "log" is due at 3, but writes no line
    assert state.last_step == 4 and ctx.metrics.step_losses == [1.0] * 5


def test_a_hook_s_result_reaches_the_hooks_after_it_in_the_same_step(tmp_path):
    ctx, state, step_fns, written = fake_run(tmp_path, steps=4)
    step_hooks = [hooks.Hook("first", 1, lambda ctx, state, step, line: {"first": step}),
                  hooks.Hook("second", 1, lambda ctx, state, step, line: {"second_saw": dict(line)},
                             writes_line=True),
                  hooks.Hook("third", 2, lambda ctx, state, step, line: {"third_saw": sorted(line)})]
    trainer._steps(ctx, state, step_fns, lambda rows: rows, StopAt(0), step_hooks)
    assert written == [{"first": 1, "second_saw": {"first": 1}},
                       {"first": 2, "second_saw": {"first": 2}, "third_saw": ["first", "second_saw"]},
                       {"first": 3, "second_saw": {"first": 3}},
                       {"first": 4, "second_saw": {"first": 4}, "third_saw": ["first", "second_saw"]}]
    # what a hook is handed is read-only: it adds to the line by returning, nothing else
    writer = hooks.Hook("writer", 1, lambda ctx, state, step, line: operator.setitem(line, "x", 1) or {})
    with pytest.raises(TypeError):
        trainer.run_hooks(ctx, state, 5, [step_hooks[0], writer])


def spiky_opt_state(skipped, last_step):
    return (optim.SpikeState(losses_W=np.zeros(3, np.float32), block_norms_WL=np.zeros((3, 2), np.float32),
                             taken=np.int32(3), skipped=np.int32(skipped), last_step=np.int32(last_step),
                             last_loss=np.float32(5.0), last_mean=np.float32(2.0), last_std=np.float32(0.5),
                             last_jump_L=np.array([1.5, 3.0], np.float32), inner_state=()),)


def test_the_step_line_holds_the_latest_spike_until_a_line_has_it(tmp_path):
    ctx, state, _, _ = fake_run(tmp_path, steps=20)
    ctx = dataclasses.replace(ctx, corpus=types.SimpleNamespace(mixture=None))
    state.step_metrics = {"loss": np.float32(5.0)}
    state.train = types.SimpleNamespace(opt_state=spiky_opt_state(skipped=2, last_step=8))  # skipped at step 9
    spike = {"spike_step": 9, "spike_loss": 5.0, "spike_window_mean": 2.0, "spike_window_std": 0.5,
             "spike_grad_jump": [1.5, 3.0]}
    for last_line, has_it in [(8, True), (9, False), (12, False)]:
        state.last_step = last_line
        line = hooks.step_line(ctx, state, 12, {})
        assert {k: line[k] for k in spike if k in line} == (spike if has_it else {}), last_line
    state.train = types.SimpleNamespace(opt_state=spiky_opt_state(skipped=0, last_step=-1))  # none yet
    state.last_step = 0
    assert not any(k.startswith("spike_") for k in hooks.step_line(ctx, state, 1, {}))
    # the loop's wait warns once per new spike, with the latest
    state.spikes_seen, state.train = 1, types.SimpleNamespace(opt_state=spiky_opt_state(skipped=2, last_step=8))
    trainer.sync(ctx, state, 12)
    trainer.sync(ctx, state, 13)
    assert state.spikes_seen == 2 and len(ctx.bar.written) == 1
    assert "1 loss spike(s) skipped" in ctx.bar.written[0] and "latest at step 9" in ctx.bar.written[0]
    assert "block 2 (x3), block 1 (x1.5)" in ctx.bar.written[0]


def test_the_wait_names_the_step_of_the_first_loss_that_is_not_finite(tmp_path):
    ctx, state, _, _ = fake_run(tmp_path, steps=20)
    ctx = dataclasses.replace(ctx, run_dir=types.SimpleNamespace(root=tmp_path, metrics=tmp_path / "metrics.jsonl"))
    state.pending_losses = [np.float32(2.0), np.float32(np.inf), np.float32(np.nan)]   # steps 8, 9 and 10
    with pytest.raises(TrainingError, match=r"^non-finite loss inf at step 9; metrics so far are in "):
        trainer.sync(ctx, state, 10)
    assert ctx.metrics.step_losses[:2] == [2.0, np.inf] and np.isnan(ctx.metrics.step_losses[2])
    assert not state.pending_losses


def test_the_losses_of_the_steps_before_a_failure_are_kept(tmp_path):
    ctx, state, (step_fn, _), _ = fake_run(tmp_path, steps=6)
    ctx.metrics.close = lambda: None

    def failing_at_step_4(train, batch):
        if len(state.pending_losses) == 3:   # no hook is due, so the loop has not waited since step 1
            raise RuntimeError("the device is lost")
        return step_fn(train, batch)

    with pytest.raises(RuntimeError, match="the device is lost"):
        trainer._steps(ctx, state, (failing_at_step_4,) * 2, lambda rows: rows, StopAt(0), [])
    trainer._close(ctx, state)
    assert ctx.metrics.step_losses == [1.0] * 3


@pytest.mark.parametrize("every,steps", [(5, [1, 5, 10]), (0, [])])
def test_diagnostics_run_at_step_1_and_every_diagnostics_every_steps(every, steps):
    cfg = config_lib.Config()
    cfg = dataclasses.replace(cfg, diagnostics=dataclasses.replace(cfg.diagnostics, every=every))
    assert [step for step in range(1, 13) if trainer.at_diagnostics(cfg)(step)] == steps


def test_a_line_is_written_at_every_log_step_evaluation_and_diagnostics_step():
    cfg = config_lib.Config()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=12, log_every=10, eval_every=4),
                              diagnostics=dataclasses.replace(cfg.diagnostics, every=5))
    log = next(hook for hook in trainer.step_hooks(cfg, has_checkpoints=False) if hook.writes_line)
    assert [step for step in range(1, 13) if log.due(step)] == [1, 4, 5, 8, 10, 12]


@pytest.mark.parametrize("every,steps", [(5, [5, 10, 12]), (0, [12])])
def test_a_run_evaluates_every_eval_every_steps_and_at_its_last(every, steps):
    cfg = config_lib.Config()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=12, eval_every=every))
    assert [step for step in range(1, 13) if trainer.at_eval(cfg)(step)] == steps


def test_the_step_line_s_throughput_mfu_and_skipped_updates(tmp_path, monkeypatch):
    import jax
    import optax
    from andrea_jax import ramps
    ctx, state, _, _ = fake_run(tmp_path, steps=20)
    cfg = dataclasses.replace(ctx.cfg, optim=dataclasses.replace(ctx.cfg.optim, skip_nonfinite=True))
    ctx = dataclasses.replace(ctx, cfg=cfg, corpus=types.SimpleNamespace(mixture=None), flops_per_token=6.0,
                              peak_flops=1e3)
    guard = optax.ApplyIfFiniteState(notfinite_count=np.int32(0), last_finite=np.bool_(True),
                                     total_notfinite=np.int32(3), inner_state=())
    state.train = types.SimpleNamespace(opt_state=(guard,))
    state.step_metrics, state.last_step, state.last_time = {"loss": np.float32(5.0)}, 4, 10.0
    monkeypatch.setattr(hooks.time, "perf_counter", lambda: 12.0)   # 2 s since the line of step 4
    monkeypatch.setattr(jax, "device_count", lambda: 4)   # the peak is per chip: mfu divides by the chips
    line = hooks.step_line(ctx, state, 12, {})
    per_step = cfg.train.batch_size * cfg.model.seq_len
    assert ramps.tokens_at(cfg, 12) - ramps.tokens_at(cfg, 4) == 8 * per_step   # no ramp: 8 steps' tokens
    assert line["tokens_per_sec"] == 8 * per_step / 2.0
    assert line["mfu"] == pytest.approx(8 * per_step / 2.0 * 6.0 / (1e3 * 4), rel=1e-12)
    assert line["skipped_updates"] == 3 and "tokens" not in line   # a run without a ramp: no running total
    no_peak = hooks.step_line(dataclasses.replace(ctx, peak_flops=None), state, 12, {})
    assert "mfu" not in no_peak


def test_validation_prints_its_loss_and_adds_the_knockout_and_the_average_s(tmp_path):
    ctx, state, _, _ = fake_run(tmp_path, steps=4)
    batches = [np.zeros((2, 5), np.int32)] * 2   # 8 targets each
    eval_step = lambda params, step, batch, bpt: (np.float32(params["w"]), np.float32(10.0))
    knock = lambda params, step, batch: np.array([params["w"] + 1, params["w"] + 3], np.float32)
    state.step_metrics = {"loss": np.float32(2.5)}
    state.train = types.SimpleNamespace(params={"w": 2.0}, step=4, opt_state=optim.EmaState({"w": 1.5}, ()))
    assert hooks.validate(ctx, state, 4, {}) == {}   # no validation batches: nothing, and nothing printed
    assert ctx.bar.written == []
    ctx = dataclasses.replace(ctx, val=batches, eval_step=eval_step, knockout_step=knock)
    line = hooks.validate(ctx, state, 4, {})
    bpb = lambda loss: loss * 16 / (np.log(2.0) * 20.0)   # 16 targets, 20 bytes
    assert line == {"val_loss": 2.0, "val_bpb": pytest.approx(bpb(2.0)), "knockout": [1.0, 3.0],
                    "val_loss_ema": 1.5, "val_bpb_ema": pytest.approx(bpb(1.5))}
    assert ctx.bar.written == ["step 4: loss 2.5000  val_loss 2.0000"]


def test_the_context_names_where_metrics_and_checkpoints_are(tmp_path):
    ctx, state, _, _ = fake_run(tmp_path, steps=4)
    ctx = dataclasses.replace(ctx, run_dir=types.SimpleNamespace(metrics=tmp_path / "metrics.jsonl"))
    assert ctx.where == f"metrics so far are in {tmp_path / 'metrics.jsonl'}" and ctx.saved_at(5) is None
    ctx = dataclasses.replace(ctx, ckpt=types.SimpleNamespace(directory=tmp_path / "checkpoints"))
    assert ctx.where == (f"metrics so far are in {tmp_path / 'metrics.jsonl'}, checkpoints (none after the "
                         f"failure) in {tmp_path / 'checkpoints'}")
    assert ctx.saved_at(5) == f"{tmp_path / 'checkpoints'}/5"


def test_the_spike_score_hook_scores_the_run_s_losses_with_its_window_and_sigmas(tmp_path):
    from andrea_jax.train import diagnostics
    ctx, state, _, _ = fake_run(tmp_path, steps=4)
    g = ctx.cfg.diagnostics
    losses = list(3.0 + 0.1 * np.random.default_rng(0).standard_normal(g.spike_window + 200))
    for at in range(g.spike_window + 10, len(losses), 20):
        losses[at] += 0.1 * (4 + 3 * (at % 3))   # spikes of 4, 7 and 10 sd
    ctx = dataclasses.replace(ctx, metrics=types.SimpleNamespace(step_losses=losses))
    want = diagnostics.spike_score(losses, g.spike_window, g.spike_sigmas)
    assert 0 < want != diagnostics.spike_score(losses, g.spike_window, 2 * g.spike_sigmas)
    assert want != diagnostics.spike_score(losses, g.spike_window // 2, g.spike_sigmas)
    assert hooks.spike_score(ctx, state, 4, {}) == {"spike_score": want}
    assert hooks.latest_spike(spiky_opt_state(skipped=0, last_step=-1)) == (0, None)
