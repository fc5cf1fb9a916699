#!/usr/bin/env bash
# Every GPU check and benchmark in one device call, sized for under 8 minutes on one H200:
# kernels against XLA (correctness on the GPU, then GB/s and speedup), then train-step MFU of
# ANDREA-120M with XLA and with Pallas kernels. Synthetic tokens only: the GPU machine has no
# grain / TFDS. Results go to $OUT (the device tool's folder) or ./gpu_results.
set -u
cd "$(dirname "$0")/.."
out="${OUT:-gpu_results}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.txt"
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" | tee -a "$out/gpu.txt"
timeout 330 python3 benchmarks/kernels_gpu.py --budget-s 300 --out "$out/kernels.md" --json "$out/kernels.jsonl" \
  2>&1 | tee "$out/kernels.log"
for impl in xla pallas; do
  timeout 60 python3 benchmarks/train_step.py --config andrea_120m --batch 32 --steps 20 --set kernels.impl=$impl \
    2>&1 | tail -1 | tee -a "$out/train_step.jsonl"
done
