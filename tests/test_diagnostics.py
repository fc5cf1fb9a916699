"""Per-layer diagnostics from the scan against an unscanned loop, per-layer gradient norms against
autodiff of that loop, the spike score against a brute-force count, and the trainer's logging."""
import dataclasses
import json
import struct
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import _ref_blocks as ref
from _helpers import forward_logits, perturbed_params
from andrea_jax import config as config_lib, configs
from andrea_jax.train import diagnostics, hooks, steps, loop as trainer
from andrea_jax import model as model_lib
from andrea_jax.config import ModelConfig

SMALL = ModelConfig(vocab_size=300, seq_len=16, d_model=32, n_layer=4, n_head=4)
# Jitted, as the train step is: run op by op, each of their operations would compile on its own.
loss_fn = jax.jit(steps.loss_fn, static_argnums=1)


@pytest.mark.parametrize("norm,gates", [("pre", "none"), ("post", "none"), ("sandwich", "none"),
                                        ("deepnorm", "none"), ("lns", "learned")])
def test_scan_statistics_equal_an_unscanned_loop(norm, gates):
    cfg = dataclasses.replace(SMALL, norm=norm, gates=gates)
    params = perturbed_params(cfg)
    tokens = jax.random.randint(jax.random.key(2), (2, 12), 0, cfg.vocab_size)
    alphas = jnp.array([0.1, 1.0, 0.6, 0.35])
    logits, stats, kv = jax.jit(model_lib.Andrea(cfg, diagnostics=True).apply)({"params": params}, tokens, alphas)
    assert kv is None  # no cache asked for
    want_logits, want = jax.jit(ref.forward, static_argnums=(0, 4))(norm, params, tokens, alphas, cfg.n_head)
    # float32, the same math in another order (unscanned loop): measured max |diff| 8.3e-7 on
    # logits of order 1.
    np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-5)
    # Asking for diagnostics does not change the forward pass (two compilations of the same math:
    # measured equal, natively and under AVX2 and SSE4_2).
    np.testing.assert_allclose(logits, forward_logits(model_lib.Andrea(cfg), params, tokens, alphas),
                               rtol=1e-6, atol=1e-6)
    for key in ("resid_rms", "attn_ratio", "mlp_ratio"):
        assert stats[key].shape == (cfg.n_layer,), key
        np.testing.assert_allclose(stats[key], want[key], rtol=1e-5, err_msg=key)  # measured 6.1e-7
    gate = params["blocks"]["residual_gate"] if gates == "learned" else 1.0
    np.testing.assert_allclose(stats["alpha"], alphas * gate, rtol=1e-6)  # one float32 multiply: measured exact


def test_unscaled_branch_ratios_equal_a_hand_computation_on_two_post_ln_blocks():
    # Post-LN, alphas [0, 0.5]: block 1's branches still have a size (alpha divided out, not
    # multiplied in), and its output is LN(LN(x)) of the embeddings alone.
    cfg = dataclasses.replace(SMALL, norm="post", n_layer=2)
    params = perturbed_params(cfg)
    tokens = jax.random.randint(jax.random.key(3), (2, 10), 0, cfg.vocab_size)
    stats = jax.jit(model_lib.Andrea(cfg, diagnostics=True).apply)({"params": params}, tokens,
                                                                    jnp.array([0.0, 0.5])).stats

    @jax.jit
    def by_hand(params):  # the two blocks written out
        want = {"attn_branch_ratio": [], "mlp_branch_ratio": [], "attn_ratio": []}
        x = params["tok_embedding"][tokens] + params["pos_embedding"][:10]
        for l, a in enumerate([0.0, 0.5]):
            p = jax.tree.map(lambda v: v[l], params["blocks"])
            f_attn = ref.attention(p, x, cfg.n_head)
            h = ref.layer_norm(x + a * f_attn, p, "ln1")
            f_mlp = ref.mlp(p, h)
            want["attn_branch_ratio"].append(jnp.linalg.norm(f_attn) / jnp.linalg.norm(x))
            want["mlp_branch_ratio"].append(jnp.linalg.norm(f_mlp) / jnp.linalg.norm(h))
            want["attn_ratio"].append(a * jnp.linalg.norm(f_attn) / jnp.linalg.norm(x))
            x = ref.layer_norm(h + a * f_mlp, p, "ln2")
        return want

    want = by_hand(params)
    for key, values in want.items():
        # float32, the same sums in another order: measured 7.7e-8 relative (natively, AVX2, SSE4_2)
        np.testing.assert_allclose(stats[key], values, rtol=2e-6, err_msg=key)
    assert stats["attn_ratio"][0] == 0.0 and stats["attn_branch_ratio"][0] > 0.1


def small_config(**model_changes):
    cfg = config_lib.Config()
    return dataclasses.replace(
        cfg, model=dataclasses.replace(SMALL, **model_changes),
        prores=config_lib.ProResConfig(schedule="fix_sqrt_l"),  # distinct alphas from step 0
        train=dataclasses.replace(cfg.train, steps=10, batch_size=2))


# The key bias's gradient is zero but for rounding (softmax ignores what a query adds to all its keys), and
# Adam's first update is about lr x its sign: the two steps' updates agree to rounding only where both
# programs round alike, as at -O1, not -O0.
@pytest.mark.compiled_at_o1
def test_layer_gradient_norms_equal_autodiff_of_the_loop(norm="pre"):
    cfg = small_config(norm=norm)
    cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, warmup_steps=0))  # a first update that moves
    mesh = steps.make_mesh()
    state = steps.create_state(cfg, jax.random.key(0), mesh)
    state = state.replace(params=jax.device_put(perturbed_params(cfg.model), jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec())))
    tokens = jax.random.randint(jax.random.key(4), (2, 13), 0, cfg.model.vocab_size)
    L = cfg.model.n_layer
    alphas = 1.0 / np.sqrt(np.arange(1, L + 1))

    def loop_loss(layer_params, rest):
        params = {**rest, "blocks": jax.tree.map(lambda *v: jnp.stack(v), *layer_params)}
        logits, _ = ref.forward(norm, params, tokens[:, :-1], alphas, cfg.model.n_head)
        return steps.cross_entropy(logits, tokens[:, 1:])

    # The references in float64 numpy: op by op, jnp would compile its operations for every leaf's shape.
    params = jax.device_get(state.params)
    layer_params = [jax.tree.map(lambda v: v[l], params["blocks"]) for l in range(L)]
    rest = {k: v for k, v in params.items() if k != "blocks"}
    grads = jax.jit(jax.grad(loop_loss))(layer_params, rest)
    sum_of_squares = lambda x: float(np.sum(np.square(np.asarray(x, np.float64))))
    want = [np.sqrt(sum(sum_of_squares(g) for g in jax.tree.leaves(gl))) for gl in grads]

    plain_step = steps.make_train_step(cfg, mesh)
    diag_step = steps.make_train_step(cfg, mesh, with_diagnostics=True)
    copy = lambda s: jax.tree.map(jnp.array, s)  # the steps donate their input state
    plain_state, plain = plain_step(copy(state), tokens)
    diag_state, metrics = diag_step(copy(state), tokens)
    np.testing.assert_allclose(metrics["layer_grad_norm"], want, rtol=1e-5)  # measured 1.2e-7
    np.testing.assert_allclose(metrics["alpha"], alphas, rtol=1e-6)
    assert len(set(np.round(np.asarray(metrics["layer_grad_norm"]), 6))) == L  # not one number L times
    # The update-to-parameter ratio of each block, from the parameters before and after the step.
    before, after = params["blocks"], jax.device_get(diag_state.params["blocks"])
    want_ratio = [np.sqrt(sum(sum_of_squares(np.asarray(n[l], np.float64) - o[l]) for n, o in
                              zip(jax.tree.leaves(after), jax.tree.leaves(before))))
                  / np.sqrt(sum(sum_of_squares(o[l]) for o in jax.tree.leaves(before))) for l in range(L)]
    np.testing.assert_allclose(metrics["update_ratio"], want_ratio, rtol=2e-6)  # the step's float32: measured 1.4e-7
    assert all(0 < r < 0.1 for r in want_ratio), want_ratio
    # The diagnostic step makes the same update as the ordinary one.
    np.testing.assert_allclose(metrics["loss"], plain["loss"], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(diag_state.params), jax.tree.leaves(plain_state.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert set(plain) == {"loss", "grad_norm", "lr"}  # ordinary steps carry no diagnostics


def test_layer_norms_of_a_stacked_tree():
    tree = {"a": jnp.arange(6.0).reshape(3, 2), "b": {"c": jnp.ones((3, 2, 2))}}
    want = [np.sqrt(0 + 1 + 4), np.sqrt(4 + 9 + 4), np.sqrt(16 + 25 + 4)]
    np.testing.assert_allclose(diagnostics.layer_norms(tree), want, rtol=1e-6)


def brute_force_spikes(losses, window, sigmas):
    flags = []
    for i in range(len(losses)):
        if i < window:
            flags.append(False)
            continue
        prev = np.asarray(losses[i - window:i])
        flags.append(losses[i] > prev.mean() + sigmas * prev.std())
    return np.array(flags)


def test_spike_score_counts_upward_excursions_against_the_rolling_window():
    rng = np.random.default_rng(0)
    losses = 5.0 - np.linspace(0, 1, 400) + 0.01 * rng.standard_normal(400)
    # Two adjacent spikes (the second judged with the first in its window) and one more.
    losses[[150, 151, 300]] += 2.0
    losses[200] -= 2.0                 # a sudden drop is not a spike
    flags = diagnostics.spike_flags(losses, window=50, sigmas=6.0)
    np.testing.assert_array_equal(flags, brute_force_spikes(losses, 50, 6.0))
    assert list(np.flatnonzero(flags)) == [150, 151, 300]
    assert diagnostics.spike_score(losses, 50, 6.0) == pytest.approx(3 / 350)
    assert diagnostics.spike_score(losses[:50], 50, 6.0) == 0.0  # nothing to score yet
    noisy = 10 * rng.standard_normal(300)
    np.testing.assert_array_equal(diagnostics.spike_flags(noisy, 20, 1.5), brute_force_spikes(noisy, 20, 1.5))


def test_knockout_sets_one_block_s_alpha_to_zero_at_a_time():
    from andrea_jax.config import Config, ProResConfig
    from andrea_jax.model import prores
    # Stagewise from 0, T = 10, L = 4, step 15: alphas [1, 0.5, 0, 0] (the last two blocks still off).
    cfg = Config(model=SMALL, prores=ProResConfig(schedule="stagewise_0", warmup=10))
    alphas = np.asarray(prores.run_alphas(cfg, 15))
    np.testing.assert_array_equal(alphas, [1.0, 0.5, 0.0, 0.0])
    params = model_lib.init(SMALL, jax.random.key(0))["params"]
    tokens = jax.random.randint(jax.random.key(1), (2, 17), 0, 300)

    def knockout(chunk):
        chunked = dataclasses.replace(cfg, diagnostics=dataclasses.replace(cfg.diagnostics, knockout_chunk=chunk))
        return np.asarray(steps.make_knockout_step(chunked, steps.make_mesh(chunked))(params, jnp.int32(15), tokens))

    losses = knockout(1)
    model = model_lib.Andrea(SMALL, padded_logits=True)
    by_hand = lambda a: float(loss_fn(params, model, tokens, jnp.asarray(a, jnp.float32)))
    base = by_hand(alphas)
    # Block 1 knocked out by hand: alphas [0, 0.5, 0, 0] (the knockout step against the plain
    # forward, other executables: measured <= 8.4e-8 natively, AVX2, SSE4_2).
    np.testing.assert_allclose(losses[0], by_hand([0.0, 0.5, 0.0, 0.0]), rtol=1e-6)
    assert abs(losses[0] - base) > 1e-3 and abs(losses[1] - base) > 1e-4
    # Blocks at alpha 0 are off already: knocking them out changes nothing (against the plain
    # forward: measured <= 1.7e-7 natively, AVX2, SSE4_2).
    np.testing.assert_allclose(losses[2:], [base, base], rtol=1e-6)
    # Exact by construction: in chunks of 1, one loop body runs each mask, and masks 3 and 4 both
    # give alphas [1, 0.5, 0, 0]: the same executable on the same inputs.
    assert losses[2] == losses[3]
    # All L masks in one vmapped pass (chunk 0), and chunks of 3 (a remainder of 1): the same L
    # losses from other executables, whose sums round differently (measured <= 8.4e-8 relative
    # natively and AVX2, <= 1.7e-7 under SSE4_2: 1 and 2 float32 ulps).
    for chunk in (0, 3):
        np.testing.assert_allclose(knockout(chunk), losses, rtol=2e-6, err_msg=f"knockout_chunk={chunk}")


def test_knockout_chunks_bound_the_memory_of_the_pass():
    from andrea_jax.config import Config, ProResConfig
    cfg = Config(model=SMALL, prores=ProResConfig(schedule="linear", warmup=10))
    params = model_lib.init(SMALL, jax.random.key(0))["params"]
    tokens = jnp.zeros((2, 17), jnp.int32)

    def temp_bytes(chunk):
        chunked = dataclasses.replace(cfg, diagnostics=dataclasses.replace(cfg.diagnostics, knockout_chunk=chunk))
        step = steps.make_knockout_step(chunked, steps.make_mesh(chunked))
        return step.lower(params, jnp.int32(5), tokens).compile().memory_analysis().temp_size_in_bytes

    # One mask at a time holds one forward's activations, two hold about twice, all L (0) the most.
    assert temp_bytes(1) < temp_bytes(2) < temp_bytes(0), [temp_bytes(c) for c in (1, 2, 0)]


# The trainer's knockout (a vmapped pass over all masks, minus the evaluation's val_loss) against
# each block's alpha set to 0 in the plain forward, both on the checkpointed parameters: other
# executables, measured equal natively with the jitted loss_fn; with the loss run op by op, 2.9e-6 apart
# natively and 9.5e-7 under XLA_FLAGS=--xla_cpu_max_isa=AVX2 (losses ~5.7).
KNOCKOUT_ATOL = 1e-5


def check_knockout_by_hand(cfg, workdir, lines):
    from andrea_jax import checkpoint
    from andrea_jax.data import pipeline
    from andrea_jax.model import prores
    val = pipeline.build(cfg)[2]
    model = model_lib.Andrea(cfg.model, padded_logits=True)
    shapes = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), model_lib.param_shapes(cfg.model))
    worst = 0.0
    for line in lines:
        params = checkpoint.read_params(workdir / "checkpoints" / str(line["step"]), shapes)
        alphas = np.asarray(prores.run_alphas(cfg, line["step"]))
        val_loss = lambda a: np.mean([float(loss_fn(params, model, b, jnp.asarray(a, jnp.float32)))
                                      for b in val])
        base = val_loss(alphas)
        by_hand = [val_loss(np.where(np.arange(len(alphas)) == l, 0.0, alphas)) - base for l in range(len(alphas))]
        np.testing.assert_allclose(line["knockout"], by_hand, atol=KNOCKOUT_ATOL, err_msg=f"step {line['step']}")
        worst = max(worst, float(np.max(np.abs(np.subtract(line["knockout"], by_hand)))))
    print(f"knockout against the plain forward: max abs difference {worst:.3g}")


def test_trainer_logs_diagnostics_to_jsonl_and_tensorboard(tmp_path):
    cfg = configs.load("tiny")
    cfg = config_lib.override(cfg, [
        "model.d_model=32", "model.n_layer=3", "model.n_head=2", "model.seq_len=32",
        "train.steps=6", "train.batch_size=4", "train.log_every=3", "train.eval_every=3",
        "train.eval_batches=1", "train.sample_tokens=0", "prores.schedule=linear", "prores.warmup=2",
        # An LR so small that the loss only moves with the batch, up as often as down, and a
        # threshold of 0.01 sigmas: some of these steps spike (steps 3 and 4, measured).
        "optim.lr=1e-6", "diagnostics.every=2", "diagnostics.spike_window=2", "diagnostics.spike_sigmas=0.01",
        "diagnostics.knockout=true", "train.checkpoint_every=3"])
    log = trainer.train(config_lib.validate(cfg), tmp_path, show_progress=False)
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == log
    assert [l["step"] for l in lines] == [1, 2, 3, 4, 6]
    diag = [l for l in lines if "resid_rms" in l]
    assert [l["step"] for l in diag] == [1, 2, 4, 6]
    for l in diag:
        for key in diagnostics.PER_LAYER:
            assert len(l[key]) == 3 and all(np.isfinite(l[key])), key
    # alpha logged is the schedule's alpha at the step the forward pass saw (t = step - 1).
    assert diag[0]["alpha"] == [0.0, 0.0, 0.0]
    np.testing.assert_allclose(diag[1]["alpha"], [0.5, 0.25, 1 / 6], rtol=1e-6)
    assert diag[0]["layer_grad_norm"] == [0.0, 0.0, 0.0]  # alpha = 0: zero block gradients
    step_losses = np.load(tmp_path / "step_losses.npy")
    assert step_losses.shape == (6,)
    # Each evaluation logs the spike score of every loss so far, as a brute-force count finds it.
    scores = {l["step"]: l["spike_score"] for l in lines if "spike_score" in l}
    assert sorted(scores) == [3, 6]
    for step, score in scores.items():
        want = brute_force_spikes(step_losses[:step], 2, 0.01).sum() / (step - 2)
        assert score == pytest.approx(want, abs=1e-12), (step, step_losses.tolist())
    assert scores[6] > 0, step_losses.tolist()
    # Knockout at each evaluation: one value per block, the loss rising when a block that is on goes.
    assert [l["step"] for l in lines if "knockout" in l] == [3, 6]
    assert all(len(l["knockout"]) == 3 and max(l["knockout"]) > 0 for l in lines if "knockout" in l)
    check_knockout_by_hand(config_lib.validate(cfg), tmp_path, [l for l in lines if "knockout" in l])

    scalars = read_tensorboard_scalars(tmp_path / "tb")
    want_tags = {"loss", "resid_rms/layer_001", "resid_rms/layer_003", "layer_grad_norm/max", "alpha/layer_002",
                 "mlp_branch_ratio/layer_003", "update_ratio/layer_001", "knockout/layer_003"}
    assert want_tags <= set(scalars)
    assert [s for s, _ in scalars["resid_rms/layer_002"]] == [1, 2, 4, 6]
    np.testing.assert_allclose([v for _, v in scalars["resid_rms/layer_002"]],
                               [l["resid_rms"][1] for l in diag], rtol=1e-6)
    np.testing.assert_allclose([v for _, v in scalars["loss"]], [l["loss"] for l in lines], rtol=1e-6)


def read_tensorboard_scalars(folder):
    """{tag: [(step, value)]} from the TFRecord event files (length, crc, Event proto, crc)."""
    from tensorboardX.proto import event_pb2

    files = sorted(folder.glob("events.out.tfevents.*"))
    assert files, f"no event files in {folder}"
    scalars = {}
    for path in files:
        data, i = path.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_the_evaluation_hook_logs_the_spike_score_of_the_run_s_losses():
    # 20 losses, window 4, 2 sigmas: jumps at 6 and 13 (each judged on a calm window), a drop at 10
    # (not a spike) and a bump at 19 of 4 standard deviations (a spike at 2 sigmas, not at 6).
    losses = [2.0, 2.01] * 10
    losses[6] = losses[13] = 5.0
    losses[10], losses[19] = 0.5, 2.025
    flags = brute_force_spikes(losses, 4, 2.0)
    assert list(np.flatnonzero(flags)) == [6, 13, 19]
    defaults = config_lib.Config()
    cfg = dataclasses.replace(defaults, diagnostics=dataclasses.replace(
        defaults.diagnostics, spike_window=4, spike_sigmas=2.0))
    ctx = hooks.Context(cfg=cfg, run_dir=None, ckpt=None, batches=None, corpus=None, val=[], eval_step=None,
                        bytes_per_token_V=None, metrics=types.SimpleNamespace(step_losses=list(losses)), bar=None)
    hook = next(h for h in trainer.step_hooks(cfg, has_checkpoints=False) if h.name == "spike_score")
    assert hook.due(cfg.train.steps) and hook.due(cfg.train.eval_every)  # at every evaluation
    assert hook.fn(ctx, None, 20, {}) == {"spike_score": 3 / 16}  # 3 of the 16 scored steps
    assert 3 / 16 == flags.sum() / (20 - 4)
    assert hooks.validate(ctx, None, 20, {}) == {}  # no validation batches: no validation metrics


def test_a_skipped_nonfinite_loss_is_a_spike_and_leaves_later_windows_alone():
    rng = np.random.default_rng(1)
    losses = 5.0 - np.linspace(0, 1, 300) + 0.01 * rng.standard_normal(300)
    losses[[100, 140]] += 2.0
    losses[120] = np.nan
    flags = diagnostics.spike_flags(losses, window=50, sigmas=6.0)
    assert list(np.flatnonzero(flags)) == [100, 120, 140]  # 140 is judged with the NaN in its window
    # against the brute force over the finite losses of each window
    for i in range(50, 300):
        prev = losses[i - 50:i][np.isfinite(losses[i - 50:i])]
        want = not np.isfinite(losses[i]) or losses[i] > prev.mean() + 6.0 * prev.std()
        assert flags[i] == want, i


def test_tensorboard_writes_without_loading_torch_or_cloud_clients_and_they_load_after(tmp_path):
    # In a fresh process, as a run starts: the writer's import pulls in neither torch (seconds of every
    # run's start where the test extra installs it) nor the bucket clients tensorboardX probes for, and
    # leaves each importable.
    program = (
        "import sys\n"
        "from andrea_jax.train import metrics\n"
        f"writer = metrics.summary_writer_class()({str(tmp_path)!r})\n"
        "writer.add_scalar('loss', 2.5, 7)\n"
        "writer.close()\n"
        "print(sorted(name for name in ('torch', 'google.cloud.storage', 'boto3') if name in sys.modules))\n"
        "import torch\n"
        "from google.cloud import storage\n"
        "print(torch.ones(2).sum().item(), storage.Client.__name__)\n")
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["[]", "2.0 Client"]
    assert read_tensorboard_scalars(tmp_path) == {"loss": [(7, 2.5)]}


def test_spike_flags_equal_a_written_out_window_with_non_finite_losses_left_out():
    from andrea_jax.train import diagnostics
    rng = np.random.default_rng(3)
    losses = 3.0 + 0.1 * rng.standard_normal(300)
    losses[0] = np.nan                       # the very first loss too: the centring must skip it
    losses[rng.choice(np.arange(1, 300), 25, replace=False)] = np.nan
    losses[rng.choice(300, 20, replace=False)] += 0.25
    losses[1] = 5.0   # the first finite loss, far from the rest: what the sums are centred on
    window, sigmas = 20, 2.0
    want, margins = np.zeros(300, bool), []
    for i in range(window, 300):
        seen = [v for v in losses[i - window:i] if np.isfinite(v)]
        threshold = np.mean(seen) + sigmas * np.std(seen)
        want[i] = not np.isfinite(losses[i]) or losses[i] > threshold
        margins += [abs(losses[i] - threshold)] if np.isfinite(losses[i]) else []
    got = diagnostics.spike_flags(losses, window, sigmas)
    assert want[window:].sum() > 25 + 5   # the non-finite ones and some of the spikes
    # the rolling sums and this loop differ in rounding (thresholds apart by at most 5.3e-13, measured) and
    # the nearest loss lies 3.0e-3 from its threshold: no flag can flip, so the flags compare exactly
    assert min(margins) > 1e-6
    np.testing.assert_array_equal(got, want)
