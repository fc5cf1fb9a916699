"""Meshes beyond data parallelism: (data, fsdp, tensor) meshes, gradient accumulation, checkpoints
that move between meshes, and the refusal of a mesh that does not fit.

The multi-device checks run in subprocesses with 8 (or 2, or 4) CPU devices, since the device
count is fixed when jax starts and the rest of the suite runs with one device.
"""
import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import portpicker
import pytest
from jax.sharding import AbstractMesh, AxisType

import train
from andrea_jax import config as config_lib, sharding, steps
from andrea_jax.config import Config, ConfigError, MeshConfig, ModelConfig, TrainConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]


def devices_env(n: int) -> dict:
    return {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={n}", "JAX_PLATFORMS": "cpu"}


def run_main(section: str):
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "sharded_train_main.py"), section],
                          env=devices_env(8), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    assert f"ALL OK {section}" in proc.stdout
    return proc.stdout


def test_every_mesh_and_microbatching_on_8_devices_equals_one_device():
    out = run_main("equal")
    for case in ["(8, 1, 1)", "(1, 8, 1)", "(2, 2, 2)", "(1, 2, 4)"]:
        assert f"OK mesh {case} == one device" in out
    assert "OK 4 microbatches == 1" in out and "OK 2 microbatches on (2, 2, 2) == 1 on one device" in out


def test_sharded_kernels_add_no_collective_to_xla_path():
    run_main("hlo")


# --- refusals, checked without devices: an abstract mesh has the shape the checks read ----------

SMALL = Config(model=ModelConfig(vocab_size=301, seq_len=32, d_model=64, n_layer=3, n_head=4),
               train=TrainConfig(batch_size=16))


def abstract(data, fsdp, tensor):
    return AbstractMesh((data, fsdp, tensor), sharding.MESH_AXES, axis_types=(AxisType.Auto,) * 3)


@pytest.mark.parametrize("mesh, overrides, rules, key, what", [
    ((1, 1, 8), {}, "", "mesh.tensor=8", "model.n_head=4"),                               # heads
    ((1, 1, 4), {"n_head": 6, "d_model": 96}, "", "mesh.tensor=4", "model.n_head=6"),
    # Heads that tensor divides make d_model, and so the MLP width, divisible too: keep the heads
    # whole to reach the MLP's own check.
    ((1, 1, 8), {"d_model": 36, "mlp_ratio": 1}, "heads=", "mesh.tensor=8", "MLP width"),  # mlp
    ((3, 1, 1), {}, "", "mesh.data=3", "train.batch_size=16"),                             # batch
    ((2, 3, 1), {}, "", "mesh.data=2 x mesh.fsdp=3", "train.batch_size=16"),
    ((1, 3, 1), {}, "batch=data", "mesh.fsdp=3", "model.d_model=64"),                      # embed
])
def test_a_mesh_that_does_not_divide_is_refused_naming_the_setting(mesh, overrides, rules, key, what):
    cfg = dataclasses.replace(SMALL, model=dataclasses.replace(SMALL.model, **overrides),
                              mesh=MeshConfig(rules=rules))
    with pytest.raises(ConfigError) as err:
        sharding.check(cfg, abstract(*mesh))
    message = str(err.value)
    assert "\n" not in message and message.startswith(key) and what in message, message


def test_microbatches_must_divide_the_batch_over_its_devices():
    cfg = dataclasses.replace(SMALL, train=dataclasses.replace(SMALL.train, microbatches=4))
    sharding.check(cfg, abstract(4, 1, 1))      # 4 rows per slice over 4 devices
    with pytest.raises(ConfigError, match="mesh.fsdp=8: train.batch_size=16 / train.microbatches=4"):
        sharding.check(cfg, abstract(1, 8, 1))  # 4 rows per slice over 8 devices
    with pytest.raises(ConfigError, match="train.microbatches: 3 does not divide train.batch_size=16"):
        config_lib.validate(dataclasses.replace(SMALL, train=dataclasses.replace(SMALL.train, microbatches=3)))


def test_microbatches_hold_the_activations_of_one_slice():
    def temp_bytes(k):
        cfg = dataclasses.replace(SMALL, train=dataclasses.replace(SMALL.train, microbatches=k))
        mesh = steps.make_mesh(cfg)
        tokens = jax.ShapeDtypeStruct((16, 33), np.int32, sharding=steps.batch_sharding(cfg, mesh))
        step = steps.make_train_step(cfg, mesh).lower(steps.abstract_state(cfg, mesh), tokens).compile()
        return step.memory_analysis().temp_size_in_bytes
    # Activations dominate this step's scratch; a quarter of the rows at a time needs about a
    # quarter of it (the tiny config, batch 16: 350, 184 and 98 MiB for 1, 2 and 4 slices).
    assert temp_bytes(4) < 0.4 * temp_bytes(1)


def test_a_mesh_that_misses_the_device_count_is_refused():
    with pytest.raises(ConfigError, match=r"^mesh.fsdp: the mesh 1x2x1 .* has 2 devices, not the 1 there are$"):
        steps.make_mesh(dataclasses.replace(SMALL, mesh=MeshConfig(data=1, fsdp=2)))
    with pytest.raises(ConfigError, match=r"^mesh.data=-1: the 8 devices are not divisible"):
        sharding.mesh_shape(MeshConfig(data=-1, fsdp=3), 8)
    assert sharding.mesh_shape(MeshConfig(data=2, fsdp=-1, tensor=2), 8) == (2, 2, 2)
    assert sharding.mesh_shape(MeshConfig(), 8) == (8, 1, 1)


def test_default_mesh_is_data_parallel_over_every_device():
    mesh = steps.make_mesh()
    assert mesh.axis_names == sharding.MESH_AXES and mesh.shape["data"] == jax.device_count()
    assert all(t == AxisType.Auto for t in mesh.axis_types)


@pytest.mark.parametrize("bad", ["mesh.data=0", "mesh.tensor=-2", "mesh.rules=embed", "mesh.rules=embed=gpu",
                                 "mesh.rules=hidden=tensor", "train.microbatches=0"])
def test_mesh_settings_are_validated(bad, tmp_path, capsys):
    assert train.main(["--config", "tiny", "--workdir", str(tmp_path), "--set", bad]) == 2
    assert bad.split("=")[0] in capsys.readouterr().err


def test_rules_override_and_the_vocabulary_falls_back_to_whole():
    cfg = config_lib.validate(config_lib.override(SMALL, ["mesh.rules=embed=,layers=fsdp", "mesh.fsdp=3"]))
    rules = dict(sharding.rules(cfg, abstract(1, 3, 2)))
    assert rules["embed"] is None and rules["layers"] == "fsdp" and rules["heads"] == "tensor"
    assert rules["batch"] == "fsdp"                   # data has one device: dropped
    assert rules["vocab"] is None                     # 301 rows do not split in 2: kept whole, not refused
    assert dict(sharding.rules(SMALL, abstract(1, 1, 7)))["vocab"] == "tensor"  # 301 = 7 x 43


def test_params_carry_logical_names_but_stay_plain_arrays():
    from andrea_jax import model as model_lib
    specs = sharding.logical_param_specs(SMALL)
    assert tuple(specs["blocks"]["mlp_fc_kernel"]) == ("layers", "embed", "mlp")
    assert tuple(specs["blocks"]["attn_out_kernel"]) == ("layers", "heads", "embed")
    assert tuple(specs["tok_embedding"]) == ("vocab", "embed")
    assert all(len(s) == len(p.shape) for s, p in zip(jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)),
                                                      jax.tree.leaves(model_lib.param_shapes(SMALL.model))))
    params = model_lib.init(SMALL.model, jax.random.key(0))["params"]
    assert all(isinstance(p, jax.Array) for p in jax.tree.leaves(params))


# --- checkpoints move between meshes, through the trainer ----------------------------------------

def tiny_run(workdir, tok_path, n_devices, mesh, steps_=6):
    cmd = [sys.executable, str(ROOT / "train.py"), "--config", "tiny", "--workdir", str(workdir)]
    for s in [f"train.steps={steps_}", "train.checkpoint_every=2", "train.log_every=1", "train.eval_every=0",
              "train.eval_batches=1", "train.batch_size=8", "train.sample_tokens=0", "model.n_layer=2",
              "model.d_model=32", "model.seq_len=16", "model.vocab_size=300", f"data.tokenizer={tok_path}",
              "diagnostics.tensorboard=false", *[f"mesh.{k}={v}" for k, v in zip(("data", "fsdp", "tensor"), mesh)]]:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, env=devices_env(n_devices), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def losses(workdir) -> dict:
    return {l["step"]: l["loss"] for l in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())}


def test_checkpoint_restores_across_meshes_and_training_goes_on(tmp_path, tok_path):
    straight = tmp_path / "2x2x2"
    tiny_run(straight, tok_path, 8, (2, 2, 2))        # checkpoints 2, 4, 6 written by 8 devices
    one = tmp_path / "one"                             # resumed from step 2 on one device
    shutil.copytree(straight, one)
    for step in ("4", "6"):
        shutil.rmtree(one / "checkpoints" / step)
    assert "resumed at step 2" in tiny_run(one, tok_path, 1, (-1, 1, 1))
    fsdp = tmp_path / "fsdp"                           # resumed from the 1-device step 4 as fsdp=8
    shutil.copytree(one, fsdp)
    shutil.rmtree(fsdp / "checkpoints" / "6")
    assert "resumed at step 4" in tiny_run(fsdp, tok_path, 8, (1, 8, 1))

    want, got_one, got_fsdp = losses(straight), losses(one), losses(fsdp)
    assert sorted(want) == sorted(got_fsdp) == list(range(1, 7))
    # Other meshes sum in other orders: float32 rounding only (measured <= 8.4e-8 relative).
    np.testing.assert_allclose([got_one[s] for s in (3, 4)], [want[s] for s in (3, 4)], rtol=2e-6)
    np.testing.assert_allclose([got_fsdp[s] for s in (5, 6)], [want[s] for s in (5, 6)], rtol=2e-6)


# --- several hosts: 2 processes x 2 devices as fsdp=2 train like 1 process with 4 devices ---------

def test_two_processes_with_fsdp_equal_one_process(tmp_path, tok_path):
    port = portpicker.pick_unused_port()
    common = ["--set", "mesh.fsdp=2"]

    def cmd(workdir, *extra):
        c = [sys.executable, str(ROOT / "train.py"), "--config", "tiny", "--workdir", str(workdir), *extra, *common]
        for s in ["train.steps=3", "train.checkpoint_every=3", "train.log_every=1", "train.eval_every=0",
                  "train.eval_batches=1", "train.batch_size=8", "train.sample_tokens=0", "model.n_layer=2",
                  "model.d_model=32", "model.seq_len=16", "model.vocab_size=300", f"data.tokenizer={tok_path}",
                  "diagnostics.tensorboard=false"]:
            c += ["--set", s]
        return c

    procs = [subprocess.Popen(cmd(tmp_path / "multi", "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                                  "--process-id", str(i)), env=devices_env(2), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert "4 cpu device(s) in 2 process(es)" in outputs[0]
    single = subprocess.run(cmd(tmp_path / "single"), env=devices_env(4), capture_output=True, text=True, timeout=400)
    assert single.returncode == 0, single.stderr[-3000:]
    multi, one = losses(tmp_path / "multi"), losses(tmp_path / "single")
    assert sorted(multi) == sorted(one) == [1, 2, 3]
    # The same mesh, its rows fed by two processes: float32 rounding only (measured 8.4e-8 relative).
    np.testing.assert_allclose([multi[s] for s in (1, 2, 3)], [one[s] for s in (1, 2, 3)], rtol=2e-6)


def test_memory_benchmark_prints_a_row_per_layout():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "memory.py"), "--configs", "tiny",
                           "--devices", "2", "--batch", "4", "--tensor", "2"],
                          env={**os.environ, "XLA_FLAGS": ""}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [l for l in proc.stdout.splitlines() if l.startswith("| tiny")]
    assert [r.split("|")[3].strip() for r in rows] == ["data (2, 1, 1)", "fsdp (1, 2, 1)", "fsdp+tensor (1, 1, 2)"], \
        proc.stdout
