"""The GPU benchmark machine has jax, flax, optax and orbax but no grain, TFDS, tokenizers or tqdm:
the train-step benchmark must run without them, on synthetic tokens."""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
ABSENT_ON_GPU_MACHINE = ["grain", "tensorflow_datasets", "tokenizers", "tqdm", "tensorboardX", "array_record"]


def test_train_step_benchmark_runs_without_the_data_stack():
    blocker = (f"import sys, runpy\n"
               f"for name in {ABSENT_ON_GPU_MACHINE!r}: sys.modules[name] = None\n"
               f"sys.argv = ['train_step.py', '--config', 'tiny', '--batch', '4', '--steps', '2',\n"
               f"            '--peak-tflops', '1', '--set', 'model.n_layer=2', '--set', 'model.seq_len=32']\n"
               f"runpy.run_path({str(ROOT / 'benchmarks' / 'train_step.py')!r}, run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["tokens_per_sec"] > 0 and 0 < result["mfu"] and result["seq_len"] == 32
    assert result["params"] > 0 and result["loss"] > 0
