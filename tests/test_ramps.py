"""Batch and sequence-length ramps (andrea_jax/ramps.py, docs/RAMPS.md): the plan of shapes and the
token clock, the loader serving the changing shapes, refused settings, and a ramped run that compiles
once per shape and resumes exactly mid-ramp."""

import jax
import numpy as np
import pytest

from andrea_jax import config as config_lib, configs, ramps
from andrea_jax.data import loader, pipeline
from andrea_jax.errors import ConfigError, DataError
from andrea_jax.model import prores
from andrea_jax.train import budget, hooks, loop as trainer, optim, population, steps
from andrea_jax.workdir import Workdir

TOY = ["train.batch_size=4", "model.seq_len=16", "model.n_layer=2", "model.d_model=32", "model.n_head=4",
       "model.vocab_size=300", "train.sample_tokens=0", "train.eval_batches=1", "diagnostics.tensorboard=false"]
# Batch 2 until 64 tokens, length 8 until 128: steps 1-4 are 2x8, 5-6 are 4x8, then 4x16 (64 tokens a step).
RAMP = ["train.batch_ramp=2@64", "model.seq_len_ramp=8@128"]


def toy(*settings):
    return config_lib.validate(config_lib.override(configs.load("tiny"), TOY + list(settings)))


def test_the_plan_gives_each_step_its_shape_and_the_tokens_before_it():
    cfg = toy(*RAMP, "train.steps=10")
    assert [ramps.shape_at(cfg, s) for s in range(8)] == [(2, 8)] * 4 + [(4, 8)] * 2 + [(4, 16)] * 2
    assert [ramps.tokens_at(cfg, s) for s in range(9)] == [0, 16, 32, 48, 64, 96, 128, 192, 256]
    assert ramps.shapes(cfg) == [(2, 8), (4, 8), (4, 16)] and ramps.shapes(cfg, steps=4) == [(2, 8)]
    assert ramps.steps_for_tokens(cfg, 200) == 8 and ramps.steps_for_tokens(cfg, 64) == 4
    assert budget.resolve(toy(*RAMP, "train.tokens=200")).train.steps == 8   # train.tokens over the plan
    # the clock: tokens seen in steps of the full shape (64 tokens), in the jitted step too
    assert [float(ramps.clock(cfg, s)) for s in (0, 2, 5, 8)] == [0.0, 0.5, 1.5, 4.0]
    assert [float(x) for x in jax.jit(lambda s: ramps.clock(cfg, s))(np.arange(9, dtype=np.int32))] == \
        [t / 64 for t in (0, 16, 32, 48, 64, 96, 128, 192, 256)]
    assert ramps.total(cfg) == 6.0  # step 10: 384 tokens
    assert ramps.describe(cfg) == ("ramp: 3 step shape(s) (batch x seq_len), one compile each: 2x8 from step 1 "
                                   "(0 tokens), 4x8 from step 5 (64 tokens), 4x16 from step 7 (128 tokens); "
                                   "schedules count tokens seen, in steps of 64 tokens")
    # evaluation and checkpoints every 2 full steps' tokens (128): at the steps that pass 128, 256, 384
    assert [s for s in range(1, 11) if ramps.crosses(cfg, s, 2)] == [6, 8, 10]
    assert not any(ramps.crosses(c, s, 0) for c in (cfg, toy()) for s in range(1, 11))   # 0: never
    # a stage whose end is not a whole number of its steps: its last step runs past it, by less than a step
    cfg = toy("train.batch_ramp=2@72", "train.steps=6")   # 2x16 steps of 32 tokens: 3 steps, to 96 tokens
    assert [ramps.shape_at(cfg, s) for s in range(5)] == [(2, 16)] * 3 + [(4, 16)] * 2
    assert [ramps.tokens_at(cfg, s) for s in range(6)] == [0, 32, 64, 96, 160, 224]
    assert not ramps.ramped(toy()) and ramps.plan(toy()) == (ramps.Segment(0, 0, 4, 16, None),)
    # a sequence-length ramp alone is a ramp too: the clock counts its tokens
    cfg = toy("model.seq_len_ramp=8@128", "train.steps=6")   # 4x8 steps of 32 tokens to 128, then 4x16
    assert ramps.ramped(cfg) and [float(ramps.clock(cfg, s)) for s in (2, 4, 5)] == [1.0, 2.0, 3.0]
    # a run that ends inside its ramp lists only the shapes it reaches
    assert ramps.describe(toy(*RAMP, "train.steps=5")) == (
        "ramp: 2 step shape(s) (batch x seq_len), one compile each: 2x8 from step 1 (0 tokens), 4x8 from step 5 "
        "(64 tokens); schedules count tokens seen, in steps of 64 tokens")


def test_with_constant_shapes_the_token_clock_gives_the_step_clocks_alphas_and_lrs():
    # A "ramp" whose one stage is the full batch runs on the token clock at one shape: T and the LR's
    # warmup and decay in tokens are the step clock's, and so are the alphas and LRs, exactly.
    settings = ["prores.schedule=linear", "optim.warmup_steps=5", "train.steps=40", "optim.schedule=wsd"]
    by_steps = toy(*settings, "prores.warmup=6")
    by_tokens = toy(*settings, "prores.warmup_tokens=384", "train.batch_ramp=4@64")  # 384 = 6 steps of 4 x 16
    assert ramps.ramped(by_tokens) and not ramps.ramped(by_steps)
    assert ramps.plan(by_tokens) == (ramps.Segment(0, 0, 4, 16, None),)   # one shape: one segment
    step_v = np.arange(0, 41, dtype=np.int32)
    alphas = lambda cfg: np.asarray(jax.vmap(lambda s: prores.run_alphas(cfg, s))(step_v))
    np.testing.assert_array_equal(alphas(by_tokens), alphas(by_steps))
    np.testing.assert_array_equal(alphas(toy(*settings, "prores.warmup_tokens=384")), alphas(by_steps))  # no ramp
    assert 0 < alphas(by_steps)[7, 1] < 1  # mid-warmup, where a wrong clock would show
    lrs = [jax.vmap(optim.on_clock(optim.lr_schedule(cfg.optim, ramps.total(cfg)), steps._clock(cfg)))(step_v)
           for cfg in (by_tokens, by_steps)]
    np.testing.assert_array_equal(*lrs)


def test_under_a_ramp_the_alphas_and_update_scales_read_tokens_seen_not_steps():
    # RAMP's steps 1-4 see 16 tokens each, a quarter of the full 64: after 2 steps ProRes reads 0.5 full
    # steps. The reference is the paper's formula on that hand-counted clock.
    t_S = np.array([0, 16, 32, 48, 64, 96, 128, 192, 256], np.float32) / 64   # after 0..8 steps
    cfg = toy(*RAMP, "train.steps=10", "prores.schedule=linear", "prores.warmup_tokens=256",  # T = 4 full steps
              "prores.scale_updates=alpha")
    want_SL = np.minimum(1.0, t_S[:, None] / (4.0 * np.arange(1, 3)))
    assert 0 < want_SL[2, 0] < 1 and want_SL[2, 0] != min(1.0, 2 / 4)   # the step count would differ here
    # every value is a multiple of 1/32, exact in float32 on both sides: equal, not close
    for s, want_L in enumerate(want_SL):
        np.testing.assert_array_equal(prores.run_alphas(cfg, s), want_L.astype(np.float32))
        np.testing.assert_array_equal(prores.update_scales(cfg, s), want_L.astype(np.float32))


def test_the_optimizer_steps_at_the_lr_of_the_token_clock():
    # Adam's step of a constant gradient is lr x sign(g) (times 1 / (1 + eps / |g|)), so each update of
    # a parameter that decay does not touch (0) shows the LR the optimizer read: that of the ramp's
    # tokens seen (steps 1-4 see a quarter step's tokens each), not of the step count.
    cfg = toy(*RAMP, "train.steps=10", "optim.warmup_steps=3", "optim.schedule=wsd")
    tx, params = steps._tx_and_model(cfg)[0], {"x": np.zeros(4, np.float32)}
    opt_state, applied = tx.init(params), []
    for step in range(8):
        updates, opt_state = tx.update({"x": np.full(4, 0.5, np.float32)}, opt_state, params, step=step)
        applied.append(-float(updates["x"][0]))
    wanted = [float(optim.lr_schedule(cfg.optim, ramps.total(cfg))(ramps.clock(cfg, k))) for k in range(8)]
    # float32 Adam (m / sqrt(v), eps) against the schedule: measured 5.8e-7 relative at most, here
    np.testing.assert_allclose(applied, wanted, rtol=2e-6)
    assert 0 < applied[5] < cfg.optim.lr   # step 6: 1.5 full steps' tokens, mid-warmup; step 6 by count is not


def test_muon_steps_its_matrices_at_muon_lr_on_the_token_clock():
    # Muon orthogonalizes its momentum, which a constant gradient keeps a positive multiple of that
    # gradient; Newton-Schulz first divides by the norm, so each step's update of a block matrix is
    # -muon_lr(clock) times one fixed matrix. Its ratio to the schedule read at the ramp's tokens
    # seen is then the same at every step; read at the step count, it is not.
    cfg = toy(*RAMP, "train.steps=10", "optim.warmup_steps=3", "optim.schedule=wsd", "optim.name=muon")
    tx = steps._tx_and_model(cfg)[0]
    g_LIO = 0.01 * np.asarray(jax.random.normal(jax.random.key(0), (2, 4, 8)), np.float32)
    params = {"blocks": {"mlp_fc_kernel": np.zeros((2, 4, 8), np.float32)}, "x": np.zeros(4, np.float32)}
    grads = {"blocks": {"mlp_fc_kernel": g_LIO}, "x": np.full(4, 0.05, np.float32)}
    opt_state, matrix, vector = tx.init(params), [], []
    for step in range(8):
        updates, opt_state = tx.update(grads, opt_state, params, step=step)
        matrix.append(-np.asarray(updates["blocks"]["mlp_fc_kernel"]))
        vector.append(-float(updates["x"][0]))
    schedule = lambda peak, k: float(optim.lr_schedule(cfg.optim, ramps.total(cfg), peak)(k))
    on_tokens = [schedule(cfg.optim.muon_lr, ramps.clock(cfg, k)) for k in range(8)]
    on_steps = [schedule(cfg.optim.muon_lr, k) for k in range(8)]
    assert on_tokens[0] == 0 and not matrix[0].any()
    unit = matrix[-1] / on_tokens[-1]
    for k in range(1, 8):
        # float32 Newton-Schulz of rescaled inputs: measured 1.3e-6 at most (entries up to 1.15), natively
        # and with XLA_FLAGS=--xla_cpu_max_isa=AVX2
        np.testing.assert_allclose(matrix[k] / on_tokens[k], unit, rtol=0, atol=5e-6)
    # step 6 by count is past the warmup (muon_lr 0.02) where its tokens are half way (0.01): read at the
    # count, the ratio would be half the unit, far outside any rounding
    assert not np.allclose(matrix[5] / on_steps[5], unit, rtol=1e-2)
    # the rest of the parameters: AdamW at optim.lr on the same clock; float32 Adam against the schedule,
    # measured 7.0e-7 relative at most, natively and with XLA_FLAGS=--xla_cpu_max_isa=AVX2
    np.testing.assert_allclose(vector, [schedule(cfg.optim.lr, ramps.clock(cfg, k)) for k in range(8)], rtol=2e-6)


def toy_corpus():
    """(tokens, a corpus training on them): every token its own id, 40 windows of 16 + 1."""
    tokens = np.arange(16 * 40 + 1, dtype=np.int32)
    return tokens, pipeline.TokenizedCorpus(None, tokens, tokens[:17], "toy")


def stream_of_windows(tokens, seq_len, seed, n_windows):
    """The flat stream a ramp's steps read: the shuffled windows of the full length, in order."""
    ids = loader.window_stream(loader.num_windows(len(tokens), seq_len), seed)
    return loader.gather_windows(tokens, [ids[i] for i in range(n_windows)], seq_len)


@pytest.mark.parametrize("process_count", [1, 2])
def test_the_loader_serves_the_changing_shapes_without_skipping_or_repeating_a_token(process_count):
    cfg = toy(*RAMP, "train.steps=10")
    tokens, corpus = toy_corpus()
    shares = [pipeline.train_dataset(cfg, corpus, p, process_count) for p in range(process_count)]
    served = [np.concatenate([share[step] for share in shares]) for step in range(10)]
    assert [b.shape for b in served] == [(2, 9)] * 4 + [(4, 9)] * 2 + [(4, 17)] * 4
    windows = stream_of_windows(tokens, 16, cfg.train.order_seed, ramps.tokens_at(cfg, 10) // 16)   # [W, 17]
    inputs = np.concatenate([b[:, :-1].ravel() for b in served])
    targets = np.concatenate([b[:, 1:].ravel() for b in served])
    np.testing.assert_array_equal(inputs, windows[:, :-1].ravel())
    np.testing.assert_array_equal(targets, windows[:, 1:].ravel())
    assert all(np.all(np.diff(b, axis=1) == 1) for b in served)   # each row is contiguous text


@pytest.mark.parametrize("setting, message", [
    ("train.batch_ramp=3@64 model.seq_len_ramp=8@64",
     "train.batch_ramp: a step of batch 3 x length 8 does not read whole windows of model.seq_len=16"),
    ("train.batch_ramp=8@64", "train.batch_ramp: stage batch 8 exceeds train.batch_size=4"),
    ("model.seq_len_ramp=6@64", "model.seq_len_ramp: stage length 6 must be below and divide model.seq_len=16"),
    ("train.batch_ramp=2@64,2@32", "train.batch_ramp: stage '2@32' ends at 32 tokens, not after"),
    ("model.seq_len_ramp=8", "model.seq_len_ramp: stage '8' must be SIZE@TOKENS"),
])
def test_a_ramp_that_cannot_run_is_refused_in_one_line_naming_it(setting, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(")):
        toy(*setting.split())


def test_a_ramp_refuses_what_it_cannot_combine_with():
    with pytest.raises(ConfigError, match=r"^model.seq_len_ramp: a population's schedules count steps, not tokens"):
        population.check_structure([toy("model.seq_len_ramp=8@64")])
    with pytest.raises(ConfigError, match=r"^train.flops: a FLOP budget is not resolved over train.batch_ramp"):
        toy("train.batch_ramp=2@64", "train.flops=1e9")
    with pytest.raises(ConfigError, match=r"^train.batch_ramp: stage batch 2 is not divisible by train.microb"):
        toy("train.batch_ramp=2@64", "train.microbatches=4")


def ramped_run(tmp_path, tok_path, name, *, stop_at=None, monkeypatch=None):
    """A 10-step ramped toy run (ProRes and the LR mid-warmup over the ramp), checkpointed every 64
    tokens (steps 4, 6, 7, ...) and evaluated every 128 (6, 8, 10); stop_at: raise after that step's
    checkpoint, as a crash would."""
    cfg = toy(*RAMP, "train.steps=10", "train.log_every=1", "train.eval_every=2", "train.checkpoint_every=1",
              "train.keep_checkpoints=10",
              "prores.schedule=linear", "prores.warmup_tokens=256", "prores.scale_updates=alpha",
              "optim.warmup_steps=3", f"data.tokenizer={tok_path}")
    made, served = [], []
    if monkeypatch is not None:   # keep the compiled steps, to count their compiles, and the shapes they were given
        def make_train_step(*args, **kwargs):
            step_fn = real(*args, **kwargs)
            made.append(step_fn)
            return lambda state, batch: served.append(batch.shape) or step_fn(state, batch)
        real = trainer.make_train_step
        monkeypatch.setattr(trainer, "make_train_step", make_train_step)

    def crash(ctx, state, step, line):
        raise RuntimeError(f"killed after step {step}")
    extra = [hooks.Hook("crash", lambda step: step == stop_at, crash)] if stop_at else []
    try:
        lines = trainer.train(cfg, tmp_path / name, show_progress=False, extra_hooks=extra)
    except RuntimeError as e:
        assert str(e) == f"killed after step {stop_at}"
        return cfg, None, made, served
    return cfg, lines, made, served


def test_a_ramped_run_compiles_once_per_listed_shape_and_resumes_exactly_mid_ramp(tmp_path, tok_path, monkeypatch,
                                                                                  capsys):
    cfg, straight, made, served = ramped_run(tmp_path, tok_path, "straight", monkeypatch=monkeypatch)
    assert served == [(2, 9)] * 4 + [(4, 9)] * 2 + [(4, 17)] * 4   # each step's batch, of the plan's shape
    assert ramps.describe(cfg) in capsys.readouterr().out.splitlines()   # the shapes, listed at startup
    assert [made[0]._cache_size()] == [len(ramps.shapes(cfg))] == [3]   # one compile per shape
    assert [l["tokens"] for l in straight] == [16, 32, 48, 64, 96, 128, 192, 256, 320, 384]
    # the cadence counts tokens: checkpoints every 64 (1 full step), evaluations every 128
    assert Workdir(tmp_path / "straight").checkpoint_steps() == [4, 6, 7, 8, 9, 10]
    assert [l["step"] for l in straight if "val_loss" in l] == [6, 8, 10]

    assert ramped_run(tmp_path, tok_path, "run", stop_at=4)[1] is None   # after the step-4 checkpoint: 2x8
    capsys.readouterr()
    resumed = ramped_run(tmp_path, tok_path, "run")[1]
    assert "resumed at step 4" in capsys.readouterr().out
    keys = ("step", "loss", "lr", "grad_norm", "tokens", "val_loss")
    assert [[l.get(k) for k in keys] for l in resumed] == [[l.get(k) for k in keys] for l in straight[4:]]
    np.testing.assert_array_equal(np.load(tmp_path / "run" / "step_losses.npy"),
                                  np.load(tmp_path / "straight" / "step_losses.npy"))
    assert 0 < straight[3]["lr"] and straight[0]["lr"] < straight[3]["lr"]  # the LR warmup spans the ramp


def test_a_data_state_continues_only_under_the_same_ramps():
    _, corpus = toy_corpus()
    ramped, other, plain = toy(*RAMP), toy("train.batch_ramp=2@32", "model.seq_len_ramp=8@128"), toy()
    assert pipeline.fingerprint(ramped, corpus)["ramps"] == ["2@64", "8@128"]
    assert "ramps" not in pipeline.fingerprint(plain, corpus)
    batches = loader.train_iterator(pipeline.train_dataset(ramped, corpus, 0, 1))
    saved = pipeline.get_state(batches, ramped, corpus)
    with pytest.raises(DataError, match=r"^the data state of X belongs to other data or batching \(ramps: saved "
                                        r"\['2@64', '8@128'\], now \['2@32', '8@128'\]\)"):
        pipeline.set_state(loader.train_iterator(pipeline.train_dataset(other, corpus, 0, 1)), other, corpus, saved,
                           where="the data state of X")
