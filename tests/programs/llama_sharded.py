"""model.family=llama's train step on 8 CPU devices equals the same step on one device, with its
new parameters (SwiGLU's gate and up, the untied head) split as the rules say.

Run by tests/test_llama.py in a subprocess (the rest of the suite sees one device):
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/programs/llama_sharded.py
Reuses tests/programs/sharded_train.py's runner and tolerances (the gpt2 family's version of this).
"""
from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import sharded_train as base  # noqa: E402  (this script's folder is on sys.path)
from andrea_jax.train import steps  # noqa: E402

CFG = dataclasses.replace(base.CFG, model=dataclasses.replace(base.CFG.model, family="llama"))
# (2, 2, 2) and (1, 2, 4): tensor splits heads, the MLP width (gate, up, down alike) and the
# vocabulary (300 divides by 2 and 4); fsdp splits every matrix's d_model; norms stay whole.
EXPECTED = {"['blocks']['attn_qkv_kernel']": P(None, "fsdp", None),
            "['blocks']['attn_out_kernel']": P(None, "tensor", "fsdp"),
            "['blocks']['mlp_gate_kernel']": P(None, "fsdp", "tensor"),
            "['blocks']['mlp_up_kernel']": P(None, "fsdp", "tensor"),
            "['blocks']['mlp_proj_kernel']": P(None, "tensor", "fsdp"),
            "['tok_embedding']": P("tensor", "fsdp"), "['lm_head_kernel']": P("fsdp", "tensor")}


def main():
    batches = [np.asarray(jax.random.randint(jax.random.key(i), base.TOKENS_SHAPE, 0, 300), np.int32) for i in range(3)]
    one_cfg = base.configure(CFG, (1, 1, 1))
    ref_losses, ref_state, _, ref_first = base.run(one_cfg, steps.make_mesh(one_cfg, jax.devices()[:1]), batches)
    ref_params = jax.device_get(ref_state.params)
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(ref_params),
                                                             jax.tree.leaves(ref_first.params)))
    assert moved > 100 * 1e-3 * CFG.optim.lr, f"the updates ({moved}) are too small to tell a bug from rounding"
    for shape in [(2, 2, 2), (1, 2, 4)]:
        cfg = base.configure(CFG, shape)
        mesh = steps.make_mesh(cfg)
        losses, state, _, _ = base.run(cfg, mesh, batches)
        for key, a in base.keyed(state.params).items():
            want = NamedSharding(mesh, EXPECTED.get(key, P()))
            assert a.sharding.is_equivalent_to(want, a.ndim), f"{shape} {key}: {a.sharding.spec}, want {want.spec}"
        base.assert_same(losses, state.params, ref_losses, ref_params, f"llama {shape}")
        print(f"OK llama mesh {shape} == one device", flush=True)
    print("ALL OK llama")


if __name__ == "__main__":
    main()
