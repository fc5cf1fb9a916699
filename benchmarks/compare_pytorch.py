"""The project's CPU train step side by side with the same GPT-2 in plain PyTorch eager, timed
alternately on the same cores.

    python benchmarks/compare_pytorch.py                       # the tiny config, batch 16 x 128
    python benchmarks/compare_pytorch.py --rounds 30 --json /tmp/cmp.json
    python benchmarks/compare_pytorch.py --depths 1,2,4,8 --rounds 7   # what one more block costs

Equal work. Both models are the `tiny` shape read from the config (pre-norm blocks: LayerNorm,
causal self-attention from one fused qkv projection, LayerNorm, a GELU-tanh MLP of 4 D; learned
positions, tied input/output embedding, biases everywhere), in float32, with the same parameter
count (both printed), the same batch of token windows and the same optimizer work: global-norm
clipping at 1.0, then AdamW (b1 0.9, b2 0.95, weight decay on matrices and embeddings only).
Our side is the project's own jitted train step (`andrea_jax.train.steps.make_train_step`, optimizer
from `andrea_jax.train.optim`), with `prores.schedule=none` by default: all alphas are 1, so both
models compute x + F(x) (the tiny config's linear schedule would add L scalar multiplies).
Our step does a little more: logits over the vocabulary padded to a multiple of 128 (8576
columns for 8449), a finiteness guard on the update (optax.apply_if_finite) and the gradient norm
as a metric. PyTorch uses `torch.optim.AdamW(fused=True)` and
`F.scaled_dot_product_attention(is_causal=True)`, its fastest CPU paths, and its OpenMP
threads wait passively (OMP_WAIT_POLICY=PASSIVE unless set: see below).

Three timings per model: the train step (forward, backward, clip, AdamW), forward + loss (no
gradient: jitted loss on our side, `torch.no_grad()` on PyTorch's) and forward + backward (the
gradients, no update). Each round runs every (model, timing) once, in turn, so load from other
processes falls on both alike; the table gives the median over rounds after warm-up, and the
ratio is PyTorch's time / ours (> 1: the project is faster). `torch.set_num_threads` is set to
the cores XLA's CPU client uses (the CPUs this process may run on).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
# PyTorch's OpenMP threads spin-wait after every parallel region. On cores shared with other
# processes, and with XLA's pool between the alternating calls, the spinning thread starves the
# one it waits for: measured on the shared 2-core machine (load average 9), PyTorch's tiny train
# step took 3.0 s spinning, 0.75 s passive. Set before torch loads libgomp; the value is printed.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from andrea_jax import config as config_lib, configs, model as model_lib  # noqa: E402
from andrea_jax.model import prores  # noqa: E402
from andrea_jax.train import steps  # noqa: E402

TIMINGS = ("train_step", "fwd_loss", "fwd_bwd")


class TorchBlock(torch.nn.Module):
    """x + Attn(LN1(x)), then x + MLP(LN2(x)); the layout of andrea_jax.model.Block."""

    def __init__(self, d_model: int, n_head: int, mlp_ratio: int, eps: float):
        super().__init__()
        self.n_head = n_head
        self.ln1 = torch.nn.LayerNorm(d_model, eps=eps)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.attn_out = torch.nn.Linear(d_model, d_model)
        self.ln2 = torch.nn.LayerNorm(d_model, eps=eps)
        self.fc = torch.nn.Linear(d_model, mlp_ratio * d_model)
        self.proj = torch.nn.Linear(mlp_ratio * d_model, d_model)

    def forward(self, x_BTD):
        B, T, D = x_BTD.shape
        H = self.n_head
        qkv = self.qkv(self.ln1(x_BTD)).view(B, T, 3, H, D // H)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [B, H, T, K]
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x_BTD = x_BTD + self.attn_out(o.transpose(1, 2).reshape(B, T, D))
        return x_BTD + self.proj(F.gelu(self.fc(self.ln2(x_BTD)), approximate="tanh"))


class TorchGPT(torch.nn.Module):
    def __init__(self, m: config_lib.ModelConfig):
        super().__init__()
        self.tok_embedding = torch.nn.Embedding(m.vocab_size, m.d_model)
        self.pos_embedding = torch.nn.Embedding(m.seq_len, m.d_model)
        self.blocks = torch.nn.ModuleList(
            TorchBlock(m.d_model, m.n_head, m.mlp_ratio, m.ln_eps) for _ in range(m.n_layer))
        self.lnf = torch.nn.LayerNorm(m.d_model, eps=m.ln_eps)

    def forward(self, tokens_BT):
        T = tokens_BT.shape[1]
        x = self.tok_embedding(tokens_BT) + self.pos_embedding.weight[:T]
        for block in self.blocks:
            x = block(x)
        return self.lnf(x) @ self.tok_embedding.weight.T  # tied output projection

    def loss(self, tokens_BT1):
        logits = self(tokens_BT1[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens_BT1[:, 1:].reshape(-1))


def load_params(model: TorchGPT, params) -> None:
    """Copies our parameter tree into the PyTorch model (block matrices are [in, out] here,
    [out, in] in torch.nn.Linear; the fused qkv columns are [q | k | v] in both)."""
    t = lambda a: torch.from_numpy(np.array(a, dtype=np.float32))
    blocks = params["blocks"]
    with torch.no_grad():
        model.tok_embedding.weight.copy_(t(params["tok_embedding"]))
        model.pos_embedding.weight.copy_(t(params["pos_embedding"]))
        model.lnf.weight.copy_(t(params["lnf_scale"]))
        model.lnf.bias.copy_(t(params["lnf_bias"]))
        for layer, block in enumerate(model.blocks):
            p = {name: t(value[layer]) for name, value in blocks.items()}
            for norm in ("ln1", "ln2"):
                getattr(block, norm).weight.copy_(p[f"{norm}_scale"])
                getattr(block, norm).bias.copy_(p[f"{norm}_bias"])
            for linear, name in ((block.qkv, "attn_qkv"), (block.attn_out, "attn_out"),
                                 (block.fc, "mlp_fc"), (block.proj, "mlp_proj")):
                linear.weight.copy_(p[f"{name}_kernel"].T)
                linear.bias.copy_(p[f"{name}_bias"])


def torch_optimizer(model: TorchGPT, o: config_lib.OptimConfig) -> torch.optim.Optimizer:
    """AdamW as andrea_jax.train.optim builds it: decay on matrices and embeddings, not on biases or
    LayerNorm gains; the peak learning rate (the schedule is a host-side scalar per step)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=o.lr, betas=(o.b1, o.b2), eps=o.eps, fused=True)


def count_torch_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # the tied embedding once


def jax_cores() -> int:
    """The CPUs XLA's CPU client sizes its thread pool by: those this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def build(cfg: config_lib.Config, batch: int, seed: int = 0, timings=TIMINGS):
    """Both sides ready to time: {name: {timing: zero-argument callable that blocks}} for the
    `timings` asked for, the parameter counts and the two initial losses at equal weights."""
    m = cfg.model
    tokens_BT1 = np.random.default_rng(seed).integers(0, m.vocab_size, (batch, m.seq_len + 1), dtype=np.int32)

    # Ours: the real train step; forward and gradient of the same model the step uses.
    mesh = steps.make_mesh(cfg)
    state = steps.create_state(cfg, jax.random.key(seed), mesh)
    train_step = steps.make_train_step(cfg, mesh) if "train_step" in timings else None
    model = model_lib.Andrea(m, cfg.kernels.impl, padded_logits=True)
    alphas_L = prores.run_alphas(cfg, 0)
    loss_jit = jax.jit(lambda p, tok: steps.loss_fn(p, model, tok, alphas_L))
    grad_jit = jax.jit(jax.value_and_grad(lambda p, tok: steps.loss_fn(p, model, tok, alphas_L)))
    tokens_jax = jax.device_put(tokens_BT1, steps.batch_sharding(cfg, mesh))
    params = jax.tree.map(jnp.copy, state.params)  # the train step donates the state's own buffers
    jax_params = sum(int(p.size) for p in jax.tree.leaves(params))
    jax_loss0 = float(loss_jit(params, tokens_jax))
    live = {"state": state}

    def jax_train_step():
        live["state"], metrics = train_step(live["state"], tokens_jax)
        jax.block_until_ready(metrics)

    ours = {"train_step": jax_train_step,
            "fwd_loss": lambda: jax.block_until_ready(loss_jit(params, tokens_jax)),
            "fwd_bwd": lambda: jax.block_until_ready(grad_jit(params, tokens_jax))}

    # PyTorch: the same shape, our initial weights copied in.
    torch.manual_seed(seed)
    net = TorchGPT(m)
    load_params(net, params)
    opt = torch_optimizer(net, cfg.optim)
    tokens_torch = torch.from_numpy(tokens_BT1.astype(np.int64))
    with torch.no_grad():
        torch_loss0 = float(net.loss(tokens_torch))

    def torch_fwd_loss():
        with torch.no_grad():
            net.loss(tokens_torch)

    def torch_fwd_bwd():
        net.zero_grad(set_to_none=True)
        net.loss(tokens_torch).backward()

    def torch_train_step():
        opt.zero_grad(set_to_none=True)
        net.loss(tokens_torch).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.optim.clip_norm)
        opt.step()

    theirs = {"train_step": torch_train_step, "fwd_loss": torch_fwd_loss, "fwd_bwd": torch_fwd_bwd}
    pick = lambda fns: {t: fns[t] for t in timings}
    return ({"jax": pick(ours), "pytorch": pick(theirs)}, {"jax": jax_params, "pytorch": count_torch_params(net)},
            {"jax": jax_loss0, "pytorch": torch_loss0})


def time_alternately(fns, rounds: int, warmup: int):
    """{side: {timing: [seconds per round]}}: every (side, timing) once per round, in turn."""
    timings = [t for t in TIMINGS if t in next(iter(fns.values()))]
    order = [(side, timing) for timing in timings for side in fns]
    for _ in range(warmup):
        for side, timing in order:
            fns[side][timing]()
    times = {side: {timing: [] for timing in timings} for side in fns}
    for _ in range(rounds):
        for side, timing in order:
            t0 = time.perf_counter()
            fns[side][timing]()
            times[side][timing].append(time.perf_counter() - t0)
    return times


def loadavg() -> str:
    try:
        return " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--batch", type=int, default=None, help="sequences per step (default: the config's)")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds (each times every pair once)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first (compiles on the first)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the cores XLA uses)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="config overrides, after the default prores.schedule=none")
    parser.add_argument("--json", default=None, help="also write the result here")
    parser.add_argument("--depths", default="", metavar="L1,L2,...",
                        help="instead: forward and gradient at each depth, and the cost of one more block")
    args = parser.parse_args(argv)
    if args.depths:
        return by_depth(args)

    cfg = config_lib.override(configs.load(args.config), ["prores.schedule=none", *args.set])
    batch = args.batch or cfg.train.batch_size
    cfg = config_lib.validate(config_lib.override(cfg, [f"train.batch_size={batch}"]))
    threads = args.threads or jax_cores()
    torch.set_num_threads(threads)

    load_before = loadavg()
    fns, n_params, loss0 = build(cfg, batch)
    times = time_alternately(fns, args.rounds, args.warmup)
    median_ms = {side: {t: float(np.median(v)) * 1e3 for t, v in by.items()} for side, by in times.items()}
    ratio = {t: median_ms["pytorch"][t] / median_ms["jax"][t] for t in TIMINGS}

    m = cfg.model
    result = {
        "config": args.config, "overrides": args.set, "batch": batch, "seq_len": m.seq_len,
        "n_layer": m.n_layer, "d_model": m.d_model, "n_head": m.n_head, "vocab_size": m.vocab_size,
        "prores": cfg.prores.schedule, "kernels": cfg.kernels.impl, "remat": str(m.remat),
        "params": n_params, "initial_loss": loss0, "threads": threads, "jax": jax.__version__,
        "torch": torch.__version__, "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
        "rounds": args.rounds, "warmup": args.warmup,
        "median_ms": median_ms, "ratio_pytorch_over_jax": ratio,
        "loadavg_before": load_before, "loadavg_after": loadavg(),
    }
    print(f"{args.config}: batch {batch} x {m.seq_len}, {m.n_layer} layers, d_model {m.d_model}, "
          f"vocab {m.vocab_size}, float32, {threads} threads; prores {cfg.prores.schedule}, "
          f"kernels {cfg.kernels.impl}; jax {jax.__version__}, torch {torch.__version__} "
          f"(OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']})")
    print(f"parameters: ours {n_params['jax']:,}  pytorch {n_params['pytorch']:,}; initial loss at equal "
          f"weights: ours {loss0['jax']:.6f}  pytorch {loss0['pytorch']:.6f}")
    print(f"median of {args.rounds} alternating rounds after {args.warmup} warm-up; load average "
          f"{load_before} before, {result['loadavg_after']} after")
    print(f"| {'ms':12s} | {'ours (JAX)':>10s} | {'PyTorch':>10s} | {'ratio':>6s} |")
    print(f"| {'-' * 12} | {'-' * 10} | {'-' * 10} | {'-' * 6} |")
    for t in TIMINGS:
        print(f"| {t:12s} | {median_ms['jax'][t]:10.1f} | {median_ms['pytorch'][t]:10.1f} | {ratio[t]:5.2f}x |")
    print("ratio = JAX speed / PyTorch speed = PyTorch ms / JAX ms (> 1: the project is faster)")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return result


def by_depth(args):
    """fwd_loss and fwd_bwd of both sides at each depth (alternating, as the main table), and
    the least-squares slope: what one more block adds to each."""
    depths = [int(d) for d in args.depths.split(",")]
    threads = args.threads or jax_cores()
    torch.set_num_threads(threads)
    load_before, rows = loadavg(), {}
    for L in depths:
        cfg = config_lib.override(configs.load(args.config), ["prores.schedule=none", *args.set, f"model.n_layer={L}"])
        batch = args.batch or cfg.train.batch_size
        cfg = config_lib.validate(config_lib.override(cfg, [f"train.batch_size={batch}"]))
        fns, _, _ = build(cfg, batch, timings=("fwd_loss", "fwd_bwd"))
        times = time_alternately(fns, args.rounds, args.warmup)
        rows[L] = {side: {t: float(np.median(v)) * 1e3 for t, v in by.items()} for side, by in times.items()}
        del fns
    slope = {side: {t: float(np.polyfit(depths, [rows[L][side][t] for L in depths], 1)[0])
                    for t in ("fwd_loss", "fwd_bwd")} for side in ("jax", "pytorch")}
    print(f"{args.config} by depth: batch {batch} x {cfg.model.seq_len}, {threads} threads, median of {args.rounds} "
          f"alternating rounds; load average {load_before} before, {loadavg()} after")
    print("| layers | ours fwd+loss | ours fwd+bwd | PyTorch fwd+loss | PyTorch fwd+bwd |")
    print("| --- | --- | --- | --- | --- |")
    for L in depths:
        r = rows[L]
        print(f"| {L} | {r['jax']['fwd_loss']:.1f} | {r['jax']['fwd_bwd']:.1f} | "
              f"{r['pytorch']['fwd_loss']:.1f} | {r['pytorch']['fwd_bwd']:.1f} |")
    print(f"| per block | {slope['jax']['fwd_loss']:.1f} | {slope['jax']['fwd_bwd']:.1f} | "
          f"{slope['pytorch']['fwd_loss']:.1f} | {slope['pytorch']['fwd_bwd']:.1f} |")
    result = {"config": args.config, "depths": depths, "median_ms": rows, "per_block_ms": slope,
              "loadavg_before": load_before, "loadavg_after": loadavg()}
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
