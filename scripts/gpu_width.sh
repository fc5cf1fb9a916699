#!/usr/bin/env bash
# Experiment L's five key arms at width 512 on one GPU (scripts/sweeps/l_width512.py, exploratory):
# none, the best warmup, linear, ramp_linear and ramp_equal, each at LR 3e-4, 1e-3 and 3e-3, seed 0,
# on the documentation subset of scripts/gpu_corpus.sh; 15 runs, each arm's three LRs one
# population (--pack 3), 3 processes at once, planned to fit one device call of 8 minutes on an
# H200. As each run ends, its outcome, time and final losses are appended to
# $OUT/gpu_width_runs.jsonl, so a call cut short keeps what finished; at the end the sweep's report
# (RESULTS.md, summary.json) and the runs' configs and metrics (runs.tar.gz) go to $OUT too.
#
#   bash scripts/gpu_wheels.sh && bash scripts/gpu_corpus.sh RAW PREPARED   # here, once
#   device run, carry [".whl", ".gpu_corpus"]:  bash scripts/gpu_width.sh [--pack N]
#   bash scripts/gpu_width.sh --smoke [--pack N] [--set K=V ...]  # on a CPU: the toy form (2 runs, a few steps)
#
# --pack N trains up to N runs that differ only in settings a population takes (here the LR) as the
# members of one population, one vmapped step for all (docs/POPULATIONS.md); 3 packs each arm whole.
set -u
cd "$(dirname "$0")/.."
out="${OUT:-gpu_width_results}"
runs="${RUNS:-/tmp/gpu_width_runs}"
py="${PYTHON:-python3}"
spec=scripts/sweeps/l_width512.py
mkdir -p "$out" "$runs"
if ! "$py" -c "import grain, tensorflow_datasets" 2> /dev/null; then  # the GPU image has neither
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
smoke=0
if [ "${1:-}" = "--smoke" ]; then
  smoke=1
  shift
fi
pack=(--pack 3)
if [ "${1:-}" = "--pack" ]; then
  pack=(--pack "$2")
  shift 2
fi
if [ "$smoke" = 1 ]; then
  export JAX_PLATFORMS=cpu
  args=(--toy --jobs 1 "${pack[@]}" "$@")
else
  [ -f .gpu_corpus/manifest.json ] || { echo "no .gpu_corpus: run scripts/gpu_corpus.sh here and carry it"; exit 1; }
  export XLA_PYTHON_CLIENT_PREALLOCATE=false  # three processes share the GPU
  args=(--jobs 3 "${pack[@]}")
  nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt"
fi

report_finished() {  # one line per run that has a result.json and no line yet
  for result in "$runs"/l_width512/*/result.json; do
    [ -f "$result" ] || continue
    "$py" - "$result" "$out/gpu_width_runs.jsonl" <<'PY'
import json, pathlib, sys
result, lines = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
run = result.parent.name
if lines.is_file() and any(json.loads(l)["run"] == run for l in lines.read_text().splitlines()):
    sys.exit()
r = json.loads(result.read_text())
metrics = [json.loads(l) for l in (result.parent / "metrics.jsonl").read_text().splitlines()] \
    if (result.parent / "metrics.jsonl").is_file() else []
last = next((m for m in reversed(metrics) if "val_loss" in m), {})
line = {"run": run, "outcome": r["outcome"], "seconds": round(r["seconds"], 1), "step": last.get("step"),
        "loss": last.get("loss"), "val_loss": last.get("val_loss")}
with lines.open("a") as f:
    f.write(json.dumps(line) + "\n")
print("finished:", json.dumps(line), flush=True)
PY
  done
}

"$py" -m andrea_jax.repro.sweep "$spec" --runs "$runs" "${args[@]}" > "$out/gpu_width.log" 2>&1 &
pid=$!
while kill -0 "$pid" 2> /dev/null; do
  sleep 10
  report_finished
done
wait "$pid"; rc=$?
report_finished
if [ "$rc" != 0 ]; then  # the sweep writes its report to $runs/report once its runs end; one that failed did not
  "$py" -m andrea_jax.repro.sweep "$spec" --runs "$runs" --report --out "$runs/report" "${args[@]}" \
    >> "$out/gpu_width.log" 2>&1
fi
cp "$runs/report/RESULTS.md" "$out/RESULTS.md" 2> /dev/null
cp "$runs/report/prores_repro/summary.json" "$out/summary.json" 2> /dev/null
# the device tool returns at most 8 files: the runs' own records travel as one archive
(cd "$runs" && find l_width512 \( -name config.json -o -name metrics.jsonl -o -name result.json \) -print0 \
  | tar -czf - --null -T -) > "$out/runs.tar.gz"
tail -5 "$out/gpu_width.log"
exit "$rc"
