"""The GPU benchmark machine has jax, flax, optax and orbax but no grain, TFDS, tokenizers or tqdm:
the benchmarks must run without them, on synthetic tokens; `gpu_all.sh --smoke` runs every phase
of the GPU command on CPU at tiny shapes. And the MFU's FLOP count, checked by hand."""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ABSENT_ON_GPU_MACHINE = ["grain", "tensorflow_datasets", "tokenizers", "tqdm", "tensorboardX", "array_record"]

spec = importlib.util.spec_from_file_location("bench_mfu", ROOT / "benchmarks" / "mfu.py")
mfu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mfu)


def test_train_step_benchmark_runs_without_the_data_stack():
    blocker = (f"import sys, runpy\n"
               f"for name in {ABSENT_ON_GPU_MACHINE!r}: sys.modules[name] = None\n"
               f"sys.argv = ['train_step.py', '--config', 'tiny', '--batch', '4', '--steps', '2',\n"
               f"            '--peak-tflops', '1', '--set', 'model.n_layer=2', '--set', 'model.seq_len=32']\n"
               f"runpy.run_path({str(ROOT / 'benchmarks' / 'train_step.py')!r}, run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["tokens_per_s"] > 0 and 0 < result["mfu"] and result["seq_len"] == 32
    assert result["params"] > 0 and result["loss"] > 0 and result["peak_bytes"] > 0


def test_gpu_all_smoke_writes_every_phase_to_jsonl(tmp_path):
    # Modules that fail to import stand first on the path: the GPU machine lacks them.
    absent = tmp_path / "absent"
    absent.mkdir()
    for name in ABSENT_ON_GPU_MACHINE:
        (absent / f"{name}.py").write_text("raise ImportError('not on the GPU machine')\n")
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([str(absent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(["bash", "benchmarks/gpu_all.sh", "--smoke"], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    by_phase = {}
    for r in records:
        by_phase.setdefault(r["phase"], []).append(r)
    assert set(by_phase) == {"kernels_check", "kernels", "train_step", "microbatches"}
    assert all(r["ok"] for r in by_phase["kernels_check"])
    assert {r["remat"] for r in by_phase["train_step"]} == {"none", "dots", "full"}
    for r in by_phase["train_step"] + by_phase["microbatches"]:
        assert "error" not in r and "skipped" not in r, r
        assert r["tokens_per_s"] > 0 and r["peak_bytes"] > 0
        assert r["mfu"] is None and r["device_kind"] == "cpu"  # no peak FLOP/s for a CPU
        assert r["attention"] == "xla"  # model.attention=cudnn falls back on CPU
    assert by_phase["microbatches"][0]["microbatches"] == 2
    # The printed summary carries the same figures.
    assert "tokens/s, MFU n/a" in proc.stdout and "peak memory" in proc.stdout


def test_flops_per_token_by_hand():
    # andrea_120m: D 768, L 12, F 3072, V 8449, T 1024.
    # Per block 4 D^2 + 2 D F = 2,359,296 + 4,718,592 = 7,077,888 matmul weights; x 12 = 84,934,656;
    # + V D = 6,488,832 (logits) = 91,423,488; x 6 = 548,540,928.
    # Causal attention: 6 L D (T + 1) = 6 x 12 x 768 x 1025 = 56,678,400.
    assert mfu.train_flops_per_token(768, 12, 3072, 8449, 1024) == 548_540_928 + 56_678_400
    from andrea_jax import config as config_lib
    assert mfu.model_flops_per_token(config_lib.load("andrea_120m").model) == 605_219_328


def test_causal_attention_counts_each_query_key_pair_once():
    # Two tokens, one layer, D 1, no weights: the queries see 1 and 2 keys, 3 pairs in all;
    # each pair costs 2 (QK) + 2 (AV) forward, x 3 with the backward: 36 FLOPs over 2 tokens.
    assert mfu.train_flops_per_token(1, 1, 0, 0, 2) - 6 * 4 == pytest.approx(36 / 2)


def test_peak_flops_by_device_kind():
    assert mfu.peak_flops("NVIDIA H200") == mfu.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert mfu.peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert mfu.peak_flops("cpu") is None and mfu.mfu(1e6, 1e9, None) is None
    assert mfu.mfu(1e3, 989e6, 989e12) == pytest.approx(1e-3)
    assert mfu.mfu(1e3, 989e6, 989e12, n_chips=2) == pytest.approx(5e-4)
