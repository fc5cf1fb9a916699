"""benchmarks/compare_pytorch.py times the same model in PyTorch: check that it is the same model
(every parameter mapped, the same logits and loss at equal weights, the same count) and that
the script runs end to end at a toy size."""
import importlib.util
import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import torch

from andrea_jax import config as config_lib, configs, model as model_lib
from andrea_jax.train import steps

ROOT = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("compare_pytorch", ROOT / "benchmarks" / "compare_pytorch.py")
compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare)

TOY = ["model.n_layer=2", "model.d_model=32", "model.n_head=4", "model.seq_len=16", "model.vocab_size=300"]


def test_torch_model_computes_our_logits_at_equal_weights():
    cfg = config_lib.validate(config_lib.override(configs.load("tiny"), TOY))
    # Every leaf random (biases and LayerNorm gains too: at init they are 0 and 1, which would
    # hide a bias mapped to the wrong place or a transposed gain), drawn by numpy into the model's
    # parameter tree; our side runs jitted: op by op, jax would compile every operation on its own.
    rng = np.random.default_rng(1)
    params = jax.tree.map(lambda p: (0.3 * rng.standard_normal(p.shape)).astype(p.dtype),
                          model_lib.param_shapes(cfg.model))
    tokens_BT1 = np.random.default_rng(0).integers(0, cfg.model.vocab_size, (3, cfg.model.seq_len + 1), dtype=np.int32)

    logits = jax.jit(lambda p, tokens_BT: model_lib.Andrea(cfg.model).apply({"params": p}, tokens_BT,
                                                                              np.ones(2, np.float32)).logits)
    ours = logits(params, tokens_BT1[:, :-1])
    net = compare.TorchGPT(cfg.model)
    compare.load_params(net, params)
    with torch.no_grad():
        theirs = net(torch.from_numpy(tokens_BT1[:, :-1].astype(np.int64))).numpy()
        torch_loss = float(net.loss(torch.from_numpy(tokens_BT1.astype(np.int64))))
    assert theirs.shape == ours.shape
    # Measured max |difference| 6.0e-7 on logits up to 1.7 (float32, different op orders); a
    # bias swapped between the two LayerNorms of block 0 moves them by 1.0.
    np.testing.assert_allclose(theirs, np.asarray(ours), rtol=0, atol=1e-5)
    our_loss = float(jax.jit(lambda p, tokens: steps.loss_fn(p, model_lib.Andrea(cfg.model, padded_logits=True),
                                                              tokens, np.ones(2, np.float32)))(params, tokens_BT1))
    assert abs(torch_loss - our_loss) < 1e-5  # measured 0.0 (loss 5.83)
    assert compare.count_torch_params(net) == model_lib.count_params(cfg.model)


def test_script_runs_both_sides_at_a_toy_size(tmp_path):
    out = tmp_path / "cmp.json"
    args = ["--batch", "2", "--rounds", "2", "--warmup", "1", "--json", str(out)]
    for o in TOY:
        args += ["--set", o]
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare_pytorch.py"), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    cfg = config_lib.validate(config_lib.override(configs.load("tiny"), TOY))
    assert result["params"]["jax"] == result["params"]["pytorch"] == model_lib.count_params(cfg.model)
    # The same initial weights and batch on both sides: measured 5.721405 on both (difference
    # below 1e-6).
    assert abs(result["initial_loss"]["jax"] - result["initial_loss"]["pytorch"]) < 1e-5
    assert abs(result["initial_loss"]["jax"] - np.log(300)) < 0.5  # ~uniform at init
    for side in ("jax", "pytorch"):
        assert set(result["median_ms"][side]) == {"train_step", "fwd_loss", "fwd_bwd"}
        assert all(ms > 0 for ms in result["median_ms"][side].values())
    assert result["prores"] == "none" and result["omp_wait_policy"]
    assert "| train_step" in proc.stdout and "ratio" in proc.stdout
