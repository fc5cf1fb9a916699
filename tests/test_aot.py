"""andrea_jax.aot: the train and eval steps compiled for an H200 on this CPU-only machine, through the
CUDA plugin's deviceless XLA:GPU pipeline (the gpu-compile extra, in the test extra); a compile
leaves the kernels' target as it found it."""
import os
import re
import subprocess
import sys

import pytest

from andrea_jax import aot
from andrea_jax.aot import hlo_stats


def run_aot(*args, timeout=600):
    pytest.importorskip("jax_plugins.xla_cuda12", reason="needs the gpu-compile extra (the CUDA PJRT plugin)")
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
    return subprocess.run([sys.executable, "-m", "andrea_jax.aot", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def gib_of(text: str, what: str) -> float:
    return float(re.search(rf"{what} ([0-9.]+) GiB", text).group(1))


def test_andrea_120m_compiles_for_h200_with_pallas_kernels_and_cudnn_attention(tmp_path):
    proc = run_aot("--target", "h200", "--config", "andrea_120m", "--set", "train.batch_size=8",
                   "--set", "kernels.impl=pallas", "--set", "model.attention=cudnn", "--dump-hlo", str(tmp_path),
                   "--roofline")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    # the Pallas kernels went through Triton: 3 forward kernels and their backwards in the train step
    hlo = (tmp_path / "train.hlo").read_text()
    assert hlo_stats.kernel_counts(hlo)["pallas_triton"] >= 6, out
    # cuDNN flash attention, forward and backward, in the train step
    fmha = set(re.findall(r'custom_call_target="(__cudnn\$fmha[A-Za-z]*)"', hlo))
    assert any("Backward" in t for t in fmha) and any("Backward" not in t for t in fmha), fmha
    assert "cudnn_fmha 0" not in out.splitlines()[2]
    # the peak is printed, and is below the H200's memory
    peak = gib_of(out.splitlines()[1], "peak")
    assert 0 < peak < aot.target_memory("h200") / 2**30
    # the memory is consistent: the train state (params + 2 Adam moments, float32) is an argument
    n_params = 92_331_264
    assert gib_of(out, "arguments") >= 3 * 4 * n_params / 2**30 - 0.01
    # the float32 stream's LayerNorms write bf16 for their matmuls themselves (no convert-only
    # kernels), and the logits backward runs bf16 x bf16 -> f32 (no f32 x f32 matmul)
    assert hlo_stats.convert_fusions(hlo) == 0, out
    matmuls = hlo_stats.matmul_dtypes(hlo)
    assert not any(k.startswith("f32 x f32") for k in matmuls) and matmuls.get("bf16 x bf16 -> f32", 0) >= 2, matmuls
    # the roofline counts every layer's kernels: its FLOPs are the model's (mfu.py's count, 4.958e12
    # at 8 x 1024 tokens) and a little more (LayerNorm, GELU, softmax, the optimizer), and it bounds MFU
    roof = re.search(r"train step roofline .*?([0-9.e+]+) FLOPs.*step >= ([0-9.]+) ms.*MFU <= ([0-9.]+)%", out)
    assert roof, out
    assert 1.0 < float(roof.group(1)) / 4.958e12 < 1.1 and float(roof.group(2)) > 0 and 0 < float(roof.group(3)) < 100
    assert len(re.findall(r"^ +[0-9.]+ ms +(compute|memory) ", out, re.M)) == 20, out  # 10 a step


def test_a_config_that_cannot_fit_exits_1_with_one_line():
    proc = run_aot("--target", "h200", "--config", "andrea_120m", "--set", "train.batch_size=4096",
                   "--set", "model.remat=none", "--no-eval")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "does not fit one h200" in errors[0], proc.stderr[-2000:]


def test_mesh_2_2_2_compiles_across_8_virtual_h100s():
    proc = run_aot("--target", "h100", "--config", "andrea_120m", "--devices", "8", "--no-eval",
                   "--set", "train.batch_size=16", "--set", "mesh.data=2", "--set", "mesh.fsdp=2",
                   "--set", "mesh.tensor=2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "x 8:" in proc.stdout.splitlines()[0]
    # fsdp x tensor = 4 shards of the state: a device holds about a quarter of the replicated one
    args = gib_of(proc.stdout, "arguments")
    assert args < 0.4 * 3 * 4 * 92_331_264 / 2**30, proc.stdout


def test_bad_settings_are_refused_before_compiling():
    proc = run_aot("--target", "h200", "--config", "andrea_120m", "--set", "mesh.tensor=8", "--devices", "8")
    assert proc.returncode == 2 and proc.stderr.strip().startswith("config error: mesh.tensor=8"), proc.stderr


def test_target_descriptions_ship_with_the_package():
    for name in aot.TARGETS:
        assert aot.target_memory(name) > 40 * 2**30
    assert aot.target_kind("h200") == "NVIDIA H200"
    with pytest.raises(ValueError, match="unknown target"):
        aot.target_config("v100")


def test_jax_triton_kernels_compile_for_the_target_without_a_gpu():
    pytest.importorskip("jax_triton", reason="jax-triton is in the test extra")
    proc = run_aot("--target", "h100", "--config", "tiny", "--set", "kernels.impl=triton",
                   "--set", "model.dtype=bfloat16", "--no-eval")
    assert proc.returncode == 0, proc.stderr[-2000:]
    kernels = proc.stdout.splitlines()[2]
    # LayerNorm, residual LayerNorm and bias+GELU forward, and their backwards, by jax-triton
    assert re.search(r"jax_triton [1-9]\d*", kernels) and "pallas_triton 0" in kernels, kernels


def test_document_mask_reaches_cudnn_attention_as_a_per_row_bias(tmp_path):
    """data.document_mask on the cuDNN path: the forward attention call takes a fourth operand,
    the [B, 1, T, T] mask folded into a bias (one per row: rows hold different documents); the
    unmasked call has none."""
    common = ("--target", "h200", "--config", "tiny", "--set", "model.attention=cudnn",
              "--set", "model.dtype=bfloat16", "--no-eval")
    calls = {}
    for mask in ("true", "false"):
        proc = run_aot(*common, "--set", f"data.document_mask={mask}", "--dump-hlo", str(tmp_path / mask))
        assert proc.returncode == 0, proc.stderr[-2000:]
        calls[mask] = hlo_stats.cudnn_attention_operands((tmp_path / mask / "train.hlo").read_text())
        printed = [line for line in proc.stdout.splitlines() if line.startswith("train step cuDNN attention: ")]
        assert printed == [f"train step cuDNN attention: {t}({', '.join(s)})" for t, s in calls[mask].items()]
    q = "bf16[16,128,4,32]"  # tiny: batch 16, seq_len 128, 4 heads of 32
    assert calls["true"] == {"__cudnn$fmhaScaleBiasSoftmax": [q, q, q, "bf16[16,1,128,128]"]}, calls
    assert calls["false"] == {"__cudnn$fmhaSoftmax": [q, q, q]}, calls


def test_a_compile_puts_back_the_kernels_target_it_found_an_exception_included(monkeypatch):
    """compile_steps traces for its own backend and compute capability, then hands back the caller's:
    a later trace in the same process is for the target it had before, after a failed compile too."""
    import jax

    from andrea_jax import config as config_lib, configs
    from andrea_jax.kernels import platform
    from andrea_jax.train import steps

    cfg = config_lib.validate(config_lib.override(configs.load("tiny"), [
        "model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.seq_len=16", "train.batch_size=2"]))
    seen, make_mesh = [], steps.make_mesh

    def recording_make_mesh(*args, fail=False):
        seen.append((platform.TARGET_BACKEND, platform.TARGET_COMPUTE_CAPABILITY))
        if fail:
            raise RuntimeError("compile failed")
        return make_mesh(*args)

    compile_cpu = lambda: aot.compile_steps(cfg, jax.devices("cpu")[:1], eval_step=False, count_flops=False,
                                            backend="cpu", compute_capability=90)
    with platform.target("gpu", 80):  # the caller's own target, distinct from the compile's in both fields
        monkeypatch.setattr(steps, "make_mesh", recording_make_mesh)
        (report,) = compile_cpu()
        assert report.step == "train" and report.temp_bytes > 0
        assert (platform.TARGET_BACKEND, platform.TARGET_COMPUTE_CAPABILITY) == ("gpu", 80)
        monkeypatch.setattr(steps, "make_mesh", lambda *args: recording_make_mesh(*args, fail=True))
        with pytest.raises(RuntimeError, match="compile failed"):
            compile_cpu()
        assert (platform.TARGET_BACKEND, platform.TARGET_COMPUTE_CAPABILITY) == ("gpu", 80)
    assert seen == [("cpu", 90), ("cpu", 90)]
    assert (platform.TARGET_BACKEND, platform.TARGET_COMPUTE_CAPABILITY) == (None, None)


def test_a_population_reports_its_memory_and_n_members_peak_above_one():
    """--population N compiles the population's vmapped train step (here for the CPU, which needs no
    plugin): N members hold N states, so the peak grows with N, and the description says it is a population."""
    import jax

    from andrea_jax import config as config_lib, configs
    from andrea_jax.aot.__main__ import describe

    cfg = config_lib.validate(config_lib.override(configs.load("tiny"), [
        "model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.seq_len=16", "train.batch_size=4",
        "model.vocab_size=300"]))
    compile_cpu = lambda n: aot.compile_steps(cfg, jax.devices("cpu")[:1], backend="cpu", population=n)
    (one,), (four,) = compile_cpu(1), compile_cpu(4)
    assert one.step == four.step == "train" and one.flops is None
    assert four.peak_bytes > one.peak_bytes and four.argument_bytes > 3.5 * one.argument_bytes
    lines = describe(cfg, "h200", 1, [four], population=4)
    assert lines[1].startswith("population of 4 members: one vmapped train step")
    assert lines[2].startswith("train step: compiled in") and f"peak {four.peak_bytes / 2**30:.2f} GiB" in lines[2]


def test_a_gpu_compile_keeps_its_kernels_for_the_next_and_the_program_is_the_same(tmp_path, monkeypatch):
    """With $ANDREA_GPU_KERNEL_CACHE set, a GPU compile writes the kernels XLA:GPU built into one file for
    the device kind (it found none there, so it built every kernel, as a compile without the cache does),
    and the next compile finds them all there (it adds nothing) and compiles the same program."""
    pytest.importorskip("jax_plugins.xla_cuda12", reason="needs the gpu-compile extra (the CUDA PJRT plugin)")
    from andrea_jax import config as config_lib, configs

    cfg = config_lib.validate(config_lib.override(configs.load("tiny"), [
        "model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.seq_len=16", "train.batch_size=2",
        "model.vocab_size=300"]))
    devices = aot.gpu_devices("h100", 1)
    compile_gpu = lambda: aot.compile_steps(cfg, devices, eval_step=False, count_flops=False)[0]
    monkeypatch.setenv(aot.KERNEL_CACHE, str(tmp_path / "kernels"))
    first = compile_gpu()
    (cache_file,) = (tmp_path / "kernels").iterdir()
    assert aot.target_kind("h100") == "NVIDIA H100 80GB HBM3" and cache_file.name == "nvidia_h100_80gb_hbm3.bin"
    written = cache_file.read_bytes()
    assert len(written) > 0
    second = compile_gpu()
    assert cache_file.read_bytes() == written
    # the program without its metadata and stack frame tables, which say where it was compiled from
    program = lambda report: re.sub(r", metadata=\{[^}]*\}", "", report.hlo.split("\nFileNames\n")[0])
    assert program(first) == program(second) and first.peak_bytes == second.peak_bytes
