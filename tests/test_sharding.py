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
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import portpicker
import pytest
from jax.sharding import AbstractMesh, AxisType

import train
from andrea_jax import config as config_lib
from andrea_jax import model as model_lib
from andrea_jax.model import prores
from andrea_jax.train import sharding, steps
from andrea_jax.config import Config, ConfigError, MeshConfig, ModelConfig, OptimConfig, ProResConfig, TrainConfig
from _devices import cpu_devices_env
from _jaxpr import all_eqns

ROOT = pathlib.Path(__file__).resolve().parents[1]


def devices_env(n: int) -> dict:
    return cpu_devices_env(n)


def run_main(section: str):
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "programs" / "sharded_train.py"), section],
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
    # quarter of it (SMALL above, batch 16 x 33 tokens: measured 13.3, 7.8 and 4.8 MiB of temp for
    # 1, 2 and 4 slices, a ratio of 0.36 for 4; CPU, jax 0.10.2).
    assert temp_bytes(4) < 0.4 * temp_bytes(1)


MICRO = Config(model=ModelConfig(vocab_size=300, seq_len=16, d_model=32, n_layer=2, n_head=4),
               prores=ProResConfig(schedule="linear", warmup=2),
               # no clipping (gradient norm 1.2 here): Adam's moments then hold the gradient itself
               optim=OptimConfig(lr=3e-3, warmup_steps=0, clip_norm=1e3),
               train=TrainConfig(steps=10, batch_size=8))


def with_microbatches(k):
    return config_lib.override(MICRO, [f"train.microbatches={k}"])


def test_microbatches_accumulate_slices_into_the_update_of_the_whole_batch():
    """train.microbatches=4 against 1 on the same batch: the same update; the step loops over 4
    slices of B/4 rows; and the diagnostics are means of the 4 slices' own statistics, which
    differ from the whole batch's (a step that ignored microbatches would give those)."""
    K, mesh = 4, steps.make_mesh(MICRO)
    rng = np.random.default_rng(0)
    # Slice j is rows j, j + K (steps._microbatched); its tokens come from band j of the
    # vocabulary, whose embedding rows are scaled by 0.5, 1, 2 or 4: the slices' statistics differ.
    batch = np.stack([rng.integers(75 * (r % K), 75 * (r % K + 1), 17) for r in range(8)]).astype(np.int32)
    state = steps.create_state(with_microbatches(1), jax.random.key(0), mesh)
    scale_V1 = np.repeat(np.float32([0.5, 1.0, 2.0, 4.0]), 75)[:, None]
    params = {**state.params, "tok_embedding": np.asarray(state.params["tok_embedding"]) * scale_V1}
    state = jax.device_get(state.replace(params=params, step=jnp.int32(3)))  # mid-warmup: alphas [1, 0.75]

    def fresh(k):  # the same state in the tree of train.microbatches=k (the step donates its input)
        return jax.tree.unflatten(jax.tree.structure(steps.abstract_state(with_microbatches(k), mesh)),
                                  jax.tree.leaves(state))
    step_k = steps.make_train_step(with_microbatches(K), mesh, with_diagnostics=True)

    # The step loops over the slices: a scan of K iterations over [K, B / K, T + 1] tokens.
    loops = [e for e in all_eqns(jax.make_jaxpr(step_k)(fresh(K), batch).jaxpr)
             if e.primitive.name == "scan" and e.params["length"] == K]
    assert [tuple(e.invars[-1].aval.shape) for e in loops] == [(K, 8 // K, 17)], loops

    new1, metrics1 = steps.make_train_step(with_microbatches(1), mesh)(fresh(1), batch)
    newk, metricsk = step_k(fresh(K), batch)
    # The same gradient, summed in another order: Adam's moments after one update are 0.1 g and
    # 0.05 g^2. Measured max |difference| 5.8e-7 (mu) and 9.2e-7 (nu) of the leaf's largest; a
    # sum instead of a mean over slices is 4x, one slice alone O(1) off.
    for name in ("mu", "nu"):
        for a, b in zip(jax.tree.leaves(optax.tree_utils.tree_get(newk.opt_state, name)),
                        jax.tree.leaves(optax.tree_utils.tree_get(new1.opt_state, name))):
            np.testing.assert_allclose(a, b, rtol=0, atol=5e-6 * float(np.abs(b).max()))
    # Adam's first step is about lr * sign(g), so a rounding-level change of a near-zero gradient
    # moves its parameter by up to lr: measured max |difference| 3.4e-6 against updates of 3.0e-3
    # (1.3e-5 on another batch).
    for a, b in zip(jax.tree.leaves(newk.params), jax.tree.leaves(new1.params)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
    np.testing.assert_allclose(metricsk["loss"], metrics1["loss"], rtol=1e-6)  # measured 1.7e-7 relative
    np.testing.assert_allclose(metricsk["grad_norm"], metrics1["grad_norm"], rtol=1e-6)  # measured equal

    # The statistics: each slice's own, averaged (measured 0 to 1.6e-7 relative apart), and 9.5%
    # (resid_rms) to 30% (attn_ratio, mlp_ratio) away from those of the batch seen whole.
    model = model_lib.Andrea(MICRO.model, diagnostics=True, padded_logits=True)
    alphas = prores.run_alphas(MICRO, jnp.int32(3))
    stats = jax.jit(lambda p, tokens: steps.objective(p, model, tokens, alphas)[1][1]["stats"])
    slices = jax.vmap(stats, in_axes=(None, 0))(params, np.stack([batch[j::K] for j in range(K)]))
    whole = stats(params, batch)
    for key in ("resid_rms", "attn_ratio", "mlp_ratio"):
        mean = np.mean(np.asarray(slices[key]), axis=0)
        np.testing.assert_allclose(metricsk[key], mean, rtol=1e-5, err_msg=key)
        assert np.abs(np.asarray(whole[key]) - mean).max() > 0.05 * np.abs(mean).max(), key


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
    spec_leaves = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    assert all(len(s) == len(p.shape)
               for s, p in zip(spec_leaves, jax.tree.leaves(model_lib.param_shapes(SMALL.model))))
    params = model_lib.init(SMALL.model, jax.random.key(0))["params"]
    assert all(isinstance(p, jax.Array) for p in jax.tree.leaves(params))


# --- checkpoints move between meshes, through the trainer ----------------------------------------

def tiny_run(workdir, tok_path, n_devices, mesh, extra=()):
    # Linear ProRes at T = 3: 2 blocks ramp until step 6, so the resumes at steps 2 and 4 below
    # (alphas [0.67, 0.33] and [1, 0.67]) restore the step the alphas come from, on another mesh.
    cmd = [sys.executable, str(ROOT / "train.py"), "--config", "tiny", "--workdir", str(workdir)]
    for s in ["train.steps=6", "train.checkpoint_every=2", "train.log_every=1", "train.eval_every=0",
              "train.eval_batches=1", "train.batch_size=8", "train.sample_tokens=0", "model.n_layer=2",
              "model.d_model=32", "model.seq_len=16", "model.vocab_size=300", f"data.tokenizer={tok_path}",
              "diagnostics.tensorboard=false", "prores.schedule=linear", "prores.warmup=3",
              *[f"mesh.{k}={v}" for k, v in zip(("data", "fsdp", "tensor"), mesh)], *extra]:
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


# --- mesh.rules from the command line: the fused qkv columns split over tensor --------------------

def saved_spec(workdir, step, name):
    """The partition spec a parameter had when the trainer saved checkpoint `step` (orbax's metadata)."""
    import orbax.checkpoint as ocp
    meta = ocp.StandardCheckpointer().metadata(workdir / "checkpoints" / str(step) / "state")
    return tuple(getattr(meta, "item_metadata", meta)["params"]["blocks"][name].sharding.partition_spec)


def test_a_rules_override_splits_qkv_over_tensor_and_trains_like_one_device(tmp_path, tok_path):
    # RULES keeps the [q|k|v] columns whole on each tensor shard; mesh.rules=qkv=tensor splits them
    # contiguously (a shard holds q and half of k), which XLA must still compute exactly.
    # 6 steps, as in the test above, whose one-device run compiles the same programs: the compilation
    # cache holds them once.
    split = tmp_path / "split"
    tiny_run(split, tok_path, 2, (1, 1, 2), extra=["mesh.rules=qkv=tensor"])
    assert saved_spec(split, 4, "attn_qkv_kernel") == (None, None, "tensor")  # [layers, embed, qkv]
    assert saved_spec(split, 4, "attn_qkv_bias") == (None, "tensor")
    assert saved_spec(split, 4, "attn_out_kernel") == (None, "tensor", None)  # heads: the rules' own
    # ... where the rules alone keep them whole on the same mesh.
    assert dict(sharding.rules(config_lib.override(SMALL, ["mesh.tensor=2"]), abstract(1, 1, 2)))["qkv"] is None
    one = tmp_path / "one"
    tiny_run(one, tok_path, 1, (-1, 1, 1))
    want, got = losses(one), losses(split)
    assert sorted(got) == sorted(want) == list(range(1, 7))
    # Another layout sums in another order: float32 rounding only. Measured 0.0 over the 6 steps, natively and
    # under --xla_cpu_max_isa=AVX2; the bound is the other meshes', whose orders measured up to 8.4e-8.
    np.testing.assert_allclose([got[s] for s in range(1, 7)], [want[s] for s in range(1, 7)], rtol=2e-6)


# --- several hosts: 2 processes x 2 devices as fsdp=2 train like 1 process with 4 devices ---------

def test_two_processes_with_fsdp_equal_one_process(tmp_path, tok_path):
    port = portpicker.pick_unused_port()
    common = ["--set", "mesh.fsdp=2"]

    def cmd(workdir, *extra):
        c = [sys.executable, str(ROOT / "train.py"), "--config", "tiny", "--workdir", str(workdir), *extra, *common]
        for s in ["train.steps=3", "train.checkpoint_every=3", "train.log_every=1", "train.eval_every=0",
                  "train.eval_batches=1", "train.batch_size=8", "train.sample_tokens=0", "model.n_layer=2",
                  "model.d_model=32", "model.seq_len=16", "model.vocab_size=300", f"data.tokenizer={tok_path}",
                  "diagnostics.tensorboard=false", "prores.schedule=linear", "prores.warmup=2"]:  # ramps to step 4
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
    # tiny shrunk by --set: the rows are what is checked, not their sizes, and a smaller step is less to compile.
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "memory.py"), "--configs", "tiny",
                           "--devices", "2", "--batch", "4", "--tensor", "2", "--remat", "none,full",
                           "--set", "model.n_layer=2", "--set", "model.seq_len=32", "--set", "model.vocab_size=300"],
                          env={**os.environ, "XLA_FLAGS": ""}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [l for l in proc.stdout.splitlines() if l.startswith("| tiny")]
    assert [(r.split("|")[3].strip(), r.split("|")[4].strip()) for r in rows] == [
        (mesh, remat) for mesh in ("data (2, 1, 1)", "fsdp (1, 2, 1)", "fsdp+tensor (1, 1, 2)")
        for remat in ("none", "full")], proc.stdout
    assert proc.stdout.startswith("h200:"), proc.stdout  # compiled by XLA:GPU for H200s (andrea_jax.aot)
