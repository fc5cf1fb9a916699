"""The GPU benchmark machine has jax, flax, optax and orbax but no grain, TFDS, tokenizers or tqdm:
the benchmarks must run without them, on synthetic tokens; `gpu_all.sh --smoke` runs every phase
of the GPU command on CPU at tiny shapes. The CPU benchmarks decode.py, step.py, data.py and population.py
run at toy sizes and print what they measure. And the MFU's FLOP count, checked by hand."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ABSENT_ON_GPU_MACHINE = ["grain", "tensorflow_datasets", "tokenizers", "tqdm", "tensorboardX", "array_record"]

from andrea_jax.train import mfu  # noqa: E402


# The toy model of gpu_all.sh --smoke (its `model`): the tests that run train_step.py on it at the
# smoke's batch of 4 compile the smoke's train steps, which the suite's compilation cache then shares.
SMOKE_MODEL = ["--set", "model.n_layer=2", "--set", "model.seq_len=32", "--set", "model.d_model=32",
               "--set", "model.vocab_size=512"]


def test_train_step_benchmark_runs_without_the_data_stack():
    argv = ["train_step.py", "--config", "tiny", "--batch", "4", "--steps", "2", "--peak-tflops", "1", *SMOKE_MODEL]
    blocker = (f"import sys, runpy\n"
               f"for name in {ABSENT_ON_GPU_MACHINE!r}: sys.modules[name] = None\n"
               f"sys.argv = {argv!r}\n"
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
    assert set(by_phase) == {"kernels_check", "kernels", "train_step", "microbatches", "determinism", "hlo_match",
                             "population"}
    assert all(r["ok"] for r in by_phase["kernels_check"])
    assert {r["remat"] for r in by_phase["train_step"]} == {"none", "dots", "full"}
    for r in by_phase["train_step"] + by_phase["microbatches"]:
        assert "error" not in r and "skipped" not in r, r
        assert r["tokens_per_s"] > 0 and r["peak_bytes"] > 0
        assert r["mfu"] is None and r["device_kind"] == "cpu"  # no peak FLOP/s for a CPU
        assert r["attention"] == "xla"  # model.attention=cudnn falls back on CPU
    assert by_phase["microbatches"][0]["microbatches"] == 2
    (same,) = by_phase["determinism"]  # XLA:CPU repeats itself bit for bit, and so does a resume
    assert same["deterministic_flags"] and same["repeat"]["losses_differing"] == same["repeat"]["params_differing"] == 0
    assert same["resume"]["batches_identical"] and same["resume"]["first_step_within"], same
    (match,) = by_phase["hlo_match"]  # aot for the CPU compiles what jit on it compiles
    assert match["signatures_differing"] == 0 and match["aot_kernels"] == match["jit_kernels"] > 0, match
    (pop,) = by_phase["population"]  # 2 members against the same 4 member-steps taken solo
    assert pop["members"] == 2 and set(pop["member_steps_per_s"]) == {"population", "solo"}
    assert pop["population_over"]["solo"] == pytest.approx(
        pop["member_steps_per_s"]["population"] / pop["member_steps_per_s"]["solo"], rel=1e-12)
    assert "== phase gpu_width not run:" in proc.stdout and ", --smoke" in proc.stdout  # its own smoke test
    # The printed summary carries the same figures.
    assert "tokens/s, MFU n/a" in proc.stdout and "peak memory" in proc.stdout


def test_gpu_plan_orders_variants_by_the_aot_compile_and_train_step_follows_it(tmp_path):
    """gpu_plan.py compiles each variant for an H200 here (andrea_jax.aot), keeps the pairs that
    decide the auto defaults adjacent, least recomputation first; train_step.py --plan runs them in
    that order and records a variant that does not fit as skipped, naming the aot peak."""
    pytest.importorskip("jax_plugins.xla_cuda12", reason="needs the gpu-compile extra")
    plan_path = tmp_path / "plan.json"
    toy = SMOKE_MODEL
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_plan.py"), "--config", "tiny", "--batch", "4",
                           *toy, "--cross", "model.remat=full,none", "--cross", "kernels.impl=pallas,xla",
                           "--out", str(plan_path)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads(plan_path.read_text())
    order = [v["overrides"] for v in plan["variants"]]
    assert order == [[f"model.remat={r}", f"kernels.impl={k}"] for r in ("none", "full") for k in ("xla", "pallas")]
    assert all(v["fits"] and 0 < v["peak_bytes"] < plan["usable_gib"] * 2**30 and v["compile_s"] > 0
               for v in plan["variants"]), plan
    plan["variants"][1]["fits"] = False  # as if remat=none with the Pallas kernels did not fit
    plan_path.write_text(json.dumps(plan))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_step.py"), "--config", "tiny",
                           "--batch", "4", "--steps", "1", *toy, "--plan", str(plan_path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    assert [r["overrides"] for r in records] == order
    skipped = records[1]["skipped"]
    assert "does not fit" in skipped and f"peak {plan['variants'][1]['peak_gib']} GiB" in skipped
    assert all(r["tokens_per_s"] > 0 for i, r in enumerate(records) if i != 1)


def test_flops_per_token_by_hand():
    # andrea_120m: D 768, L 12, F 3072, V 8449, T 1024.
    # Per block 4 D^2 + 2 D F = 2,359,296 + 4,718,592 = 7,077,888 matmul weights; x 12 = 84,934,656;
    # + V D = 6,488,832 (logits) = 91,423,488; x 6 = 548,540,928.
    # Causal attention: 6 L D (T + 1) = 6 x 12 x 768 x 1025 = 56,678,400.
    assert mfu.train_flops_per_token(768, 12, 3072, 8449, 1024) == 548_540_928 + 56_678_400
    from andrea_jax import configs
    assert mfu.model_flops_per_token(configs.load("andrea_120m").model) == 605_219_328


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


def run_benchmark(script: str, *args) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


TOY_MODEL = ["--set", "model.n_layer=2", "--set", "model.d_model=32", "--set", "model.n_head=2",
             "--set", "model.seq_len=16", "--set", "model.vocab_size=300"]


def test_decode_benchmark_runs_both_samplers_and_they_agree():
    out = run_benchmark("decode.py", "--config", "tiny", "--prompt-tokens", "4", "--new-tokens", "6",
                        "--repeats", "1", *TOY_MODEL)
    kv, full, summary = [json.loads(line) for line in out.strip().splitlines()[-3:]]
    from andrea_jax import config as config_lib, configs, model as model_lib
    cfg = config_lib.override(configs.load("tiny"), [a for a in TOY_MODEL if a != "--set"])
    for row, name in ((kv, "kv_cache"), (full, "full_recompute")):
        assert row["sampler"] == name and row["new_tokens"] == 6 and row["prompt_tokens"] == 4
        assert row["seq_len"] == 16 and row["params"] == model_lib.count_params(cfg.model) == summary["params"]
        # seconds are printed to 4 decimals, rates to 2: the rate is 6 tokens over the seconds
        low, high = row["seconds"] - 5e-5, row["seconds"] + 5e-5
        assert low > 0 and 6 / high - 0.005 <= row["tokens_per_sec"] <= 6 / low + 0.005, row
    # greedy decoding with and without the KV cache picks the same tokens (random parameters)
    assert summary["greedy_tokens_agree"] == "6/6"
    # the speedup is full_recompute's time over kv_cache's (from the unrounded times)
    assert ((full["seconds"] - 5e-5) / (kv["seconds"] + 5e-5) - 0.005 <= summary["speedup"]
            <= (full["seconds"] + 5e-5) / (kv["seconds"] - 5e-5) + 0.005), (summary, kv, full)


def test_step_benchmark_prints_a_row_per_policy_and_depth():
    # At 8 x 32 tokens the row (none, 2 layers) is the population benchmark's solo step (depth:family=tiny,
    # layers=24 with model.n_layer=2): one compile serves both through the suite's compilation cache.
    out = run_benchmark("step.py", "--depths", "1,2", "--remat", "none,full", "--batch", "8", "--steps", "1",
                        "--set", "model.seq_len=32")
    lines = out.splitlines()
    assert lines[0].startswith("| remat | layers | params | compile (s) | step (ms) |")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:6]]
    assert [(r[0], r[1]) for r in rows] == [("none", "1"), ("none", "2"), ("full", "1"), ("full", "2")]
    from andrea_jax import config as config_lib, model as model_lib
    from andrea_jax.configs.depth import depth_config
    temp = {}
    for remat, layers, params, compile_s, step_ms, cpu_ms, tokens_s, temp_mib, peak_mib in rows:
        cfg = config_lib.override(depth_config("tiny", int(layers)), ["model.seq_len=32"])
        assert params == f"{model_lib.count_params(cfg.model) / 1e6:.2f}M"
        assert min(float(compile_s), float(step_ms), float(cpu_ms), float(tokens_s.replace(",", ""))) > 0
        assert 0 < float(temp_mib) <= float(peak_mib)
        temp[remat, layers] = float(temp_mib)
    assert temp["none", "2"] > temp["none", "1"]  # activations grow with depth
    for remat in ("none", "full"):
        assert f"remat {remat}: compile 2 / 1 layers = " in out
    # XLA's memory analysis (not a timing): full remat keeps less scratch at 2 layers (measured 39% below none)
    [saved] = [int(line.split("temp ")[1].split("%")[0]) for line in lines if line.startswith("remat full at 2 layers")]
    assert saved > 0 and temp["full", "2"] < temp["none", "2"]


def test_data_mixture_benchmark_compares_the_mixture_with_a_single_dataset_at_toy_size():
    out = run_benchmark("data_mixture.py", "--n-tokens", "1100000", "--shards", "2", "--batches", "1",
                        "--repeats", "1", "--threads", "1")
    rates = [line for line in out.splitlines() if line.startswith("  per-process batch")]
    assert len(rates) == 3
    for line in rates:   # both loaders gave batches
        single, mixed = (float(line.split(name)[1].split(" M tokens/s")[0]) for name in ("single ", "mixture of 3 "))
        ratio = float(line.split("(")[-1].rstrip("x)"))
        assert single > 0 and mixed > 0 and ratio > 0


def test_data_benchmark_runs_the_loader_pretokenization_and_beam_at_toy_size():
    n = 1_100_000  # enough windows of 1025 tokens for one global batch of 512
    out = run_benchmark("data.py", "--n-tokens", str(n), "--shards", "2", "--doc-tokens", "50", "--batches", "1",
                        "--repeats", "1", "--threads", "1", "--encode-copies", "1", "--prepare",
                        "--prepare-mb", "1", "--prepare-shards", "2")
    lines = out.splitlines()
    for shards in (1, 2):
        [wrote] = [l for l in lines if l.startswith(f"wrote {n:,} tokens in ") and f"into {shards} array_record" in l]
        documents = int(wrote.split(" tokens in ")[1].split(" documents")[0].replace(",", ""))
        assert 25 < n / documents < 100  # geometric lengths of mean 50 (measured 50.2 and 50.0)
        label = "1 shard" if shards == 1 else "2 shards"
        start = lines.index(f"{n:,} tokens ({label}, {documents:,} documents), seq_len 1024, 1 grain threads")
        rates = lines[start + 1:start + 4]
        for line, (batch, global_batch, processes) in zip(rates, [(64, 64, 1), (512, 512, 1), (64, 512, 8)]):
            assert line.strip().startswith(f"per-process batch {batch:4d} x 1025 (global {global_batch}, "
                                           f"{processes} processes):"), line
            assert float(line.split(":")[-1].split("M")[0]) > 0
    assert any(l.startswith("pretokenization (encode_batch over documents") for l in lines)
    one, two = json.loads(lines[-1])["prepare"]
    assert (one["workers"], two["workers"]) == (1, 2) and one["shards"] == two["shards"] == 2
    # the same corpus gives the same tokens whatever the worker count
    assert one["tokens"] == two["tokens"] > 0 and one["text_mb"] == two["text_mb"]
    assert all(r["wall_s"] > 0 and r["tokens_per_s"] > 0 for r in (one, two))


def test_occupancy_from_registers_by_hand():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import kernel_registers as k

    # 166 registers -> 168 a thread, 5376 a warp, 12 warps an SM: 3 CTAs of 4 warps
    assert k.ctas_per_sm(166, 4) == 3
    assert k.ctas_per_sm(64, 4) == 8          # 2048 a warp: 32 warps, 8 CTAs
    assert k.ctas_per_sm(80, 4) == 6          # 2560 a warp: 25 warps, 6 CTAs
    assert k.ctas_per_sm(16, 1) == 32         # the CTA limit, not registers
    assert k.ctas_per_sm(32, 32) == 2         # the warp limit (64)


def test_hlo_match_tells_two_programs_apart_and_an_identical_one_from_itself():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import jax
    import jax.numpy as jnp
    import hlo_match

    x = jnp.ones((64, 32))
    text = lambda fn: jax.jit(fn).lower(x).compile().as_text()
    one, again, other = text(lambda v: jnp.tanh(v) * 2), text(lambda v: jnp.tanh(v) * 2), text(lambda v: v @ v.T)
    assert hlo_match.differences(hlo_match.signatures(one), hlo_match.signatures(again)) == []
    diff = hlo_match.differences(hlo_match.signatures(one), hlo_match.signatures(other))
    assert diff and all(a != b for _, a, b in diff) and sum(a for _, a, _ in diff) >= 1


def test_gpu_all_s_phase_timeouts_fit_one_call_of_8_minutes():
    script = (ROOT / "benchmarks" / "gpu_all.sh").read_text()
    gpu_branch = script[script.index("\nelse\n"):script.index("\nfi\n")]
    (line,) = [l for l in gpu_branch.splitlines() if l.strip().startswith("t_kernels=")]
    timeouts = {k.strip(): int(v) for k, v in (a.split("=") for a in line.split(";") if "=" in a)}
    phases = set(re.findall(r'timeout "\$(t_[a-z]+)"', script))
    assert phases == set(timeouts) - {"budget"} and len(phases) == 6, (phases, timeouts)
    assert sum(timeouts[t] for t in phases) <= 470  # 8 minutes less the start-up and nvidia-smi
    assert timeouts["budget"] < timeouts["t_step"]


def test_population_benchmark_prints_member_steps_per_second_of_every_side():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "population.py"), "--members", "2", "--steps", "2",
                           "--cores", "1", "--set", "model.n_layer=2"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("population benchmark: 2 members of depth:family=tiny,layers=24 model.n_layer=2"), out
    rates = {side: float(re.search(rf"^{side}: .* ([0-9.]+) member-steps/s$", out, re.M).group(1))
             for side in ("solo", "population", "solo processes")}
    assert all(r > 0 for r in rates.values()), out
    # equal work: 2 x 2 solo steps, in this process and over the one process
    assert "(median of 4)" in out and "median of 2 steps of 2 members" in out and "(median of 4 each)" in out
    for side in ("solo", "solo processes"):
        ratio = float(re.search(rf"^population / {side}: ([0-9.]+)x", out, re.M).group(1))
        assert ratio == pytest.approx(rates["population"] / rates[side], rel=0.02, abs=0.01)
