#!/usr/bin/env bash
# Every GPU benchmark in one command, sized for under 8 minutes on one H200 (docs/BENCHMARKS.md), in
# the order the first hour on a GPU needs them:
#   1. kernels       the fused kernels against XLA: correctness, then time / GB/s / speedup
#   2. train_step    andrea_120m, bf16, seq 1024, batch 64 (halved on out-of-memory), crossing
#                    remat none|dots|full x attention cudnn|xla x kernels xla|pallas in the order of
#                    benchmarks/gpu_plan.json (each variant compiled for the H200 beforehand, on a CPU,
#                    by andrea_jax.aot: those that do not fit are skipped, the pairs that decide the
#                    auto defaults run first); variants not started within the budget are recorded as
#                    skipped. Each measured MFU stands beside the roofline bound of the same program
#   3. determinism   two identical runs and a resume, with and without train.deterministic's XLA
#                    flags: differing bits, the largest difference, the resume's tolerance profile
#   4. hlo_match     the train step andrea_jax.aot compiles without a GPU against the one jit
#                    compiles on it: the kernels that differ
#   5. population    8 members of the 24-block tiny recipe in one vmapped step against the same
#                    member-steps taken solo, one after another (benchmarks/population.py)
#   6. microbatches  the paper's 512 x 1024 batch as train.microbatches slices of 64 rows
#   7. gpu_width     scripts/gpu_width.sh (Experiment L's key arms at width 512) in the time the phases
#                    left of the 470 s, if its wheels and corpus were carried (.whl, .gpu_corpus); it
#                    keeps each run that finishes. A whole gpu_width needs a call of its own.
# Each phase runs under its own timeout; every result is appended to $out/results.jsonl the
# moment it exists (one JSON object per line, fields in benchmarks/train_step.py), so a phase
# that times out keeps all it finished. tokens/s, MFU and peak memory are printed as they come.
# Synthetic tokens only: the GPU machine has no grain / TFDS / tokenizers.
#
#   bash benchmarks/gpu_all.sh            # on the GPU; results in $OUT (the device tool's folder) or ./gpu_results
#   bash benchmarks/gpu_all.sh --smoke    # the same phases on CPU at tiny shapes (tests/test_benchmarks.py)
set -u
cd "$(dirname "$0")/.."
out="${OUT:-gpu_results}"
mkdir -p "$out"
results="$out/results.jsonl"
py="${PYTHON:-python3}"
# XLA's persistent compilation cache (as train.compile_cache): a program compiled twice (an OOM retry
# at half the batch, a rerun of this script on the same machine) is compiled once
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-${ANDREA_CACHE:-$HOME/.cache/andrea_jax}/xla}"

if [ "${1:-}" = "--smoke" ]; then
  export JAX_PLATFORMS=cpu
  kernel_args=(--allow-cpu --rows 64 --dtypes float32,mixed --chain 1 --repeats 1 --budget-s 60)
  model=(--config tiny --set model.n_layer=2 --set model.seq_len=32 --set model.d_model=32 --set model.vocab_size=512)
  step_args=(--batch 4 --steps 2 --cross model.remat=none,dots,full --cross model.attention=cudnn
             --cross kernels.impl=xla)
  micro_args=(--batch 8 --steps 1 --set train.microbatches=2)
  determinism_args=(--allow-cpu --batch 4 --steps 2 --flags on)
  hlo_args=(--cpu --set train.batch_size=4)
  population_args=(--members 2 --steps 2 --cores 0 --set model.n_layer=2)
  t_kernels=150; t_step=180; t_micro=120; t_determinism=150; t_hlo=120; t_population=120; budget=150
else
  export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}"  # "fills the chip"
  kernel_args=(--rows 32768,65536 --dtypes bfloat16,mixed,float32 --budget-s 70)
  model=(--config andrea_120m --set model.dtype=bfloat16 --set model.seq_len=1024)
  step_args=(--batch 64 --steps 10 --halve-on-oom --plan benchmarks/gpu_plan.json)
  micro_args=(--batch 512 --steps 3 --set model.attention=auto --set kernels.impl=xla
              --cross train.microbatches=8,16)
  determinism_args=(--batch 4 --steps 20 --set model.n_layer=2)
  hlo_args=(--set train.batch_size=8)
  population_args=(--members 8 --steps 10 --cores 0)
  # 90 + 140 + 80 + 50 + 60 + 40 s of timeouts: under 8 minutes with the start-up
  t_kernels=90; t_step=140; t_determinism=80; t_hlo=50; t_population=60; t_micro=40; budget=105
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.txt"
fi
"$py" -c "import jax; print('jax', jax.__version__, jax.devices())" | tee -a "$out/gpu.txt"

echo "== phase kernels (timeout ${t_kernels}s)"
timeout "$t_kernels" "$py" benchmarks/kernels_gpu.py "${kernel_args[@]}" --out "$out/kernels.md" --json "$results" \
  2>&1 | tee "$out/kernels.log"
echo "== phase train_step (timeout ${t_step}s)"
timeout "$t_step" "$py" benchmarks/train_step.py "${model[@]}" "${step_args[@]}" --phase train_step \
  --budget-s "$budget" --jsonl "$results" 2>&1 | grep --line-buffered -v '^{' | tee "$out/train_step.log"
echo "== phase determinism (timeout ${t_determinism}s)"
timeout "$t_determinism" "$py" benchmarks/determinism.py "${model[@]}" "${determinism_args[@]}" --json "$results" \
  2>&1 | tee "$out/determinism.log"
echo "== phase hlo_match (timeout ${t_hlo}s)"
timeout "$t_hlo" "$py" benchmarks/hlo_match.py "${model[@]}" "${hlo_args[@]}" --json "$results" \
  2>&1 | tee "$out/hlo_match.log"
echo "== phase population (timeout ${t_population}s)"
timeout "$t_population" "$py" benchmarks/population.py "${population_args[@]}" --json "$results" \
  2>&1 | tee "$out/population.log"
echo "== phase microbatches (timeout ${t_micro}s)"
timeout "$t_micro" "$py" benchmarks/train_step.py "${model[@]}" "${micro_args[@]}" --phase microbatches \
  --budget-s $((t_micro / 2)) --jsonl "$results" 2>&1 | grep --line-buffered -v '^{' | tee "$out/microbatches.log"
left=$((470 - SECONDS))
if [ "${1:-}" != "--smoke" ] && [ -d .whl ] && [ -d .gpu_corpus ] && [ "$left" -gt 60 ]; then
  echo "== phase gpu_width (the ${left}s left)"
  OUT="$out/gpu_width" timeout "$left" bash scripts/gpu_width.sh 2>&1 | tee "$out/gpu_width.log"
else
  why="${left}s left, wheels in .whl: $([ -d .whl ] && echo yes || echo no), corpus in .gpu_corpus: $(
    [ -d .gpu_corpus ] && echo yes || echo no)"
  echo "== phase gpu_width not run: $why$([ "${1:-}" = "--smoke" ] && echo ', --smoke')"
fi
echo "== $(wc -l < "$results") results in $results"
