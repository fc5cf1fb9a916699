"""ANDREA: a GPT-2-style decoder whose blocks are scaled by ProRes alphas, in any of the paper's
norm placements (ProRes paper, Table 1).

    x = tok_embedding[ids] + pos_embedding[positions]
    for l in 1..L:  x = block_l(x)        # e.g. pre: x + a_l Attn(LN(x)), then x + a_l MLP(LN(x))
    logits = LN(x) @ tok_embedding.T

The block stack is one `nn.scan` over `Block`: parameters are stacked on a leading layer axis,
the carry is the residual stream and the scanned input is (alpha_l, l). The model knows nothing
of steps, data or optimizers: `Andrea(cfg).apply(variables, tokens_BT, alphas_L)` is the whole
contract, and it always returns an `Output(logits, stats, kv)`. With `Andrea(cfg,
diagnostics=True)` the scan also emits per-layer statistics as its outputs (ys), in
`Output.stats`; the flag is static, so a model without it computes none of them (stats is None). Parameters and the residual stream are float32 whatever `cfg.dtype`: only
the inputs of the sublayers (attention, MLP) are cast to the compute dtype, and every branch is
added to the stream in float32 with the same float32 alpha, so an early ProRes branch of alpha
1e-3 is not rounded away by a bf16 stream. The logits are computed over the vocabulary padded to
a multiple of VOCAB_ALIGN (an aligned matmul), accumulated in float32, and the padding is cut off
before the softmax: the parameters, their count and checkpoints stay unpadded.

Decoding with a KV cache: `apply(variables, tokens_BT, alphas_L, cache=KVCache(...))` writes the
keys and values of `tokens_BT` into the cache at slot `cache.index` (one [B, S, H, K] slice per
layer, carried through the same scan as its scanned input and output), attends over every filled
slot and returns the updated `(k_LBSHK, v_LBSHK)` in `Output.kv`. Rows may be left-padded: `cache.positions_BT`
gives each token's position and `cache.valid_BS` which slots hold real tokens.

Placements are the small functions in `PLACEMENTS`, each a transcription of one row of the
paper's table, over the sublayers and norms in `_Ops`. Inits (`cfg.init`) are in `_kernel_std`.
With `cfg.gates == "learned"` each block also owns a trainable scalar g_l (init 0) and uses
alpha_l * g_l in place of alpha_l (ReZero / SkipInit; with ProRes schedule `none`, exactly ReZero).
The final LayerNorm is kept for every placement: after Post-LN and DeepNorm blocks it is a second
norm of an already normalised stream, which keeps one parameter tree for all variants.

Families (`cfg.family`): the above is gpt2; llama (llama.py) swaps the layers a block is made of
(`llama.block_sublayers`: RMSNorm, bias-free attention with RoPE, SwiGLU) and the model's ends
(`llama.spine`: no position table, an untied head) behind the same placements, scan and cache.

Partitioning: parameters and key activations carry logical axis names (layers.py);
`init` returns plain arrays, `init_boxed` keeps flax's boxes for andrea_jax.train.sharding.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from typing import Callable

import jax
import jax.numpy as jnp
import flax.linen as nn

from andrea_jax import kernels
from andrea_jax.config import NORMS, ModelConfig
from andrea_jax.model import layers, llama
from andrea_jax.model.layers import (BLOCK_PARAM_AXES, STREAM_BTD, KVCache, constrain, logits_matmul,
                                     padded_vocab)

OUTPUT_PROJECTIONS = ("attn_out_kernel", "mlp_proj_kernel")
# lax.scan's `unroll` of the block stack. 1 (a loop) always, but for andrea_jax.aot's FLOP count:
# XLA's cost analysis counts a loop's body once, so it lowers the program once more unrolled.
SCAN_UNROLL: int | bool = 1


class Output(typing.NamedTuple):
    """What `Andrea.__call__` returns, whatever it is asked for."""
    logits: jax.Array           # [B, T, V] float32 (the padded vocabulary with padded_logits)
    stats: dict | None = None   # diagnostics=True: per-layer statistics of the scan, each [L]
    kv: tuple | None = None     # with a cache: (k_LBSHK, v_LBSHK), written at the call's slots


@dataclasses.dataclass(frozen=True)
class _Ops:
    """What a placement needs: the two sublayers, the block's norms and the diagnostics hook."""
    attn: Callable          # y_BTD -> Attn(y)
    mlp: Callable           # y_BTD -> MLP(y)
    norm: Callable          # (name, x, y_dtype=None) -> LN_name(x) (in y_dtype, default x's)
    residual_norm: Callable  # (name, x, f, a, y_dtype=None) -> (x + a f, LN_name(x + a f)), fused in a kernel
    record: Callable        # (sublayer, f, a, skip) -> None: notes ||a f|| / ||skip||
    layer: jnp.ndarray      # 1-based index l of this block (traced)
    n_layer: int            # L
    # the sublayers' compute dtype: a norm whose output only feeds a sublayer writes it in this
    # dtype (one bf16 write from the kernel, no separate convert); one that becomes the stream
    # (Post-LN, DeepNorm) keeps the stream's float32
    dtype: str = "float32"


def pre_block(x, a, ops):          # x + a F(Norm(x))
    f = ops.attn(ops.norm("ln1", x, ops.dtype))
    ops.record("attn", f, a, x)
    x, y = ops.residual_norm("ln2", x, f, a, ops.dtype)  # the attention residual add fused into the MLP's norm
    f = ops.mlp(y)
    ops.record("mlp", f, a, x)
    return x + a * f.astype(x.dtype)


def post_block(x, a, ops):         # Norm(x + a F(x))
    f = ops.attn(x)
    ops.record("attn", f, a, x)
    _, x = ops.residual_norm("ln1", x, f, a)
    f = ops.mlp(x)
    ops.record("mlp", f, a, x)
    return ops.residual_norm("ln2", x, f, a)[1]


def sandwich_block(x, a, ops):     # x + a Norm(F(Norm(x)))
    f = ops.norm("ln1_out", ops.attn(ops.norm("ln1", x, ops.dtype)))
    ops.record("attn", f, a, x)
    x, y = ops.residual_norm("ln2", x, f, a, ops.dtype)
    f = ops.norm("ln2_out", ops.mlp(y))
    ops.record("mlp", f, a, x)
    return x + a * f.astype(x.dtype)


def deepnorm_block(x, a, ops):     # Norm(c x + a F(x)), c = (2L)^(1/4)
    c = (2.0 * ops.n_layer) ** 0.25
    f = ops.attn(x)
    ops.record("attn", f, a, c * x)
    _, x = ops.residual_norm("ln1", c * x, f, a)
    f = ops.mlp(x)
    ops.record("mlp", f, a, c * x)
    return ops.residual_norm("ln2", c * x, f, a)[1]


def lns_block(x, a, ops):          # x + a F(Norm(x) / sqrt(l))
    shrink = jax.lax.rsqrt(ops.layer.astype(jnp.float32)).astype(x.dtype)
    f = ops.attn(ops.norm("ln1", x) * shrink)
    ops.record("attn", f, a, x)
    x, y = ops.residual_norm("ln2", x, f, a)
    f = ops.mlp(y * shrink)
    ops.record("mlp", f, a, x)
    return x + a * f.astype(x.dtype)


PLACEMENTS = {"pre": pre_block, "post": post_block, "sandwich": sandwich_block,
              "deepnorm": deepnorm_block, "lns": lns_block}
# Norms each placement owns; sandwich adds a norm on the output of each sublayer.
NORM_NAMES = {name: ("ln1", "ln2") for name in PLACEMENTS} | {"sandwich": ("ln1", "ln2", "ln1_out", "ln2_out")}
assert tuple(PLACEMENTS) == NORMS


def deepnorm_beta(n_layer: int) -> float:
    """DeepNet's init gain (8L)^(-1/4) on FFN, value and output projections."""
    return (8.0 * n_layer) ** -0.25


def _kernel_std(cfg: ModelConfig, name: str, shape, layer):
    """Std of the normal init of one block matrix (a scalar, or per column for the fused qkv)."""
    L, std = cfg.n_layer, cfg.init_std
    out_proj = name in OUTPUT_PROJECTIONS
    if cfg.init == "scaled":
        return std / math.sqrt(2 * L) if out_proj else std
    if cfg.init == "ds":  # depends on the scanned layer index: evaluated inside the scan
        return std * jax.lax.rsqrt(2.0 * layer.astype(jnp.float32)) if out_proj else std
    if cfg.init == "deepnorm":  # Xavier normal: gain * sqrt(2 / (fan_in + fan_out))
        beta, (fan_in, fan_out) = deepnorm_beta(L), shape
        if name == "attn_qkv_kernel":  # q, k, v are three [D, D] projections; only v gets beta
            D = fan_in
            gains = jnp.concatenate([jnp.ones((2 * D,)), jnp.full((D,), beta)])
            return gains * math.sqrt(1.0 / D)
        return beta * math.sqrt(2.0 / (fan_in + fan_out))
    return std


def _normal(std):
    return lambda key, shape, dtype=jnp.float32: std * jax.random.normal(key, shape, dtype)


def _rms(x):
    return jnp.sqrt(jnp.mean(jnp.square(x.astype(jnp.float32))))


def _norm2(x):
    return jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32))))


def _gpt2_sublayers(matrix, vector, cfg: ModelConfig, impl: str, cache):
    """Creates one GPT-2 block's parameters and returns its (attend, mlp, norm, residual_norm).
    Created in the spine's order (flax draws init keys in creation order): same seed, same init."""
    D, F = cfg.d_model, cfg.mlp_ratio * cfg.d_model
    zeros, ones = nn.initializers.zeros, nn.initializers.ones

    def layer_norm_params(name):
        return vector(f"{name}_scale", ones, D), vector(f"{name}_bias", zeros, D)

    norms = {"ln1": layer_norm_params("ln1")}
    qkv_kernel, qkv_bias = matrix("attn_qkv_kernel", (D, 3 * D)), vector("attn_qkv_bias", zeros, 3 * D)
    out_kernel, out_bias = matrix("attn_out_kernel", (D, D)), vector("attn_out_bias", zeros, D)
    norms["ln2"] = layer_norm_params("ln2")
    fc_kernel, fc_bias = matrix("mlp_fc_kernel", (D, F)), vector("mlp_fc_bias", zeros, F)
    proj_kernel, proj_bias = matrix("mlp_proj_kernel", (F, D)), vector("mlp_proj_bias", zeros, D)
    norms |= {name: layer_norm_params(name) for name in NORM_NAMES[cfg.norm][2:]}
    qk_gains = layers.qk_norm_gains(vector, cfg)

    def attend(y_BTD):
        return layers.attention(y_BTD, qkv_kernel, qkv_bias, out_kernel, out_bias, cfg, cache, qk_gains=qk_gains)

    def mlp(y_BTD):
        return layers.mlp(y_BTD, fc_kernel, fc_bias, proj_kernel, proj_bias, cfg, impl)

    def norm(name, x, y_dtype=None):
        return kernels.layer_norm(x, *norms[name], eps=cfg.ln_eps, impl=impl, y_dtype=y_dtype)

    def residual_norm(name, x, f, a, y_dtype=None):
        return kernels.residual_layer_norm(x, f, a, *norms[name], eps=cfg.ln_eps, impl=impl, y_dtype=y_dtype)

    return attend, mlp, norm, residual_norm


def _gpt2_spine(param, cfg: ModelConfig, tokens_BT, cache, impl: str):
    """The ends of the GPT-2 model: (x_BTD, None, head), x the token embedding plus the learned
    position embedding, head(x_BTD) the final LayerNorm and the logits of the tied embedding over
    the padded vocabulary, float32."""
    named = nn.with_logical_partitioning
    normal = nn.initializers.normal(cfg.init_std)
    tok_embedding_VD = param("tok_embedding", named(normal, ("vocab", "embed")),
                             (cfg.vocab_size, cfg.d_model), jnp.float32)
    pos_embedding_SD = param("pos_embedding", named(normal, ("seq", "embed")),
                             (cfg.seq_len, cfg.d_model), jnp.float32)
    lnf_scale = param("lnf_scale", named(nn.initializers.ones, ("act_embed",)), (cfg.d_model,), jnp.float32)
    lnf_bias = param("lnf_bias", named(nn.initializers.zeros, ("act_embed",)), (cfg.d_model,), jnp.float32)
    T = tokens_BT.shape[1]
    positions = pos_embedding_SD[:T] if cache is None else pos_embedding_SD[cache.positions_BT]
    # The lookup reads whole rows: with the table's D split (FSDP) XLA would instead gather
    # every token id and move the looked-up activations; gathering the weight is cheaper.
    table_VD = constrain(tok_embedding_VD, ("vocab", None))
    x_BTD = constrain((table_VD[tokens_BT] + positions).astype(jnp.float32), STREAM_BTD)

    def head(x_BTD):
        y_BTD = kernels.layer_norm(x_BTD, lnf_scale, lnf_bias, eps=cfg.ln_eps, impl=impl, y_dtype=cfg.dtype)
        V, P = cfg.vocab_size, padded_vocab(cfg.vocab_size)
        padded_PD = jnp.pad(tok_embedding_VD, ((0, P - V), (0, 0)))  # zero rows
        return logits_matmul(y_BTD, padded_PD.T.astype(jnp.dtype(cfg.dtype)))

    return x_BTD, None, head


class Block(nn.Module):
    """One block; `__call__(x_BTD, (alpha, l)) -> (x_BTD, (stats, kv))` is the scan body.

    stats is None unless `diagnostics`; then a dict of scalars: the RMS of the residual stream
    after the block, ||a F|| / ||skip|| (`*_ratio`) and ||F|| / ||skip|| (`*_branch_ratio`,
    defined at a = 0 too) for each sublayer (skip = the term the branch is added to: x, or c x
    under DeepNorm) and the block's effective alpha.
    """
    cfg: ModelConfig
    impl: str = "auto"
    diagnostics: bool = False

    @nn.compact
    def __call__(self, x_BTD, scanned, decode=None, rope=None):
        """scanned: (alpha, l), plus this layer's (k_BSHK, v_BSHK) cache when decoding; decode:
        None, or (index, valid_BS) shared by every layer; rope: llama's (cos, sin) tables, shared
        too (None for gpt2). Returns (x, (stats, kv)): kv is None without a cache, else this
        layer's (k_BSHK, v_BSHK) with the call's slots written."""
        alpha, layer = scanned[:2]
        kv_written = []
        cfg, impl = self.cfg, self.impl

        def matrix(name, shape):
            init = nn.with_logical_partitioning(_normal(_kernel_std(cfg, name, shape, layer)), BLOCK_PARAM_AXES[name])
            return self.param(name, init, shape, jnp.float32)

        def vector(name, init, size):
            names = BLOCK_PARAM_AXES.get(name, ("act_embed",))  # norm gains and biases: the stream's width
            return self.param(name, nn.with_logical_partitioning(init, names), (size,), jnp.float32)

        cache = None if decode is None else (*scanned[2:], *decode)
        if cfg.family == "llama":
            sublayers = llama.block_sublayers(matrix, vector, cfg, NORM_NAMES[cfg.norm], cache, rope)
        else:
            sublayers = _gpt2_sublayers(matrix, vector, cfg, impl, cache)
        attend, mlp, norm, residual_norm = sublayers
        if cfg.gates == "learned":  # ReZero / SkipInit: a trainable scalar from 0, times the ProRes alpha
            alpha = alpha * self.param("residual_gate", nn.with_logical_partitioning(nn.initializers.zeros, ()),
                                       (), jnp.float32)

        def attn(y_BTD):
            out_BTD, kv = attend(y_BTD)
            kv_written.append(kv)
            return out_BTD

        stats = {}

        def record(sublayer, f, a, skip):
            if self.diagnostics:  # the branch as the stream sees it, and unscaled (alpha divided out)
                stats[f"{sublayer}_branch_ratio"] = _norm2(f) / _norm2(skip)
                stats[f"{sublayer}_ratio"] = jnp.abs(a) * stats[f"{sublayer}_branch_ratio"]

        ops = _Ops(attn=attn, mlp=mlp, norm=norm, residual_norm=residual_norm, record=record,
                   layer=layer, n_layer=cfg.n_layer, dtype=cfg.dtype)
        # alpha stays float32 and every add happens on the float32 stream, in the kernels and outside.
        x_BTD = PLACEMENTS[cfg.norm](constrain(x_BTD, STREAM_BTD), jnp.asarray(alpha, jnp.float32), ops)
        x_BTD = constrain(x_BTD, STREAM_BTD)  # the carry leaves the block in the layout it came in
        if self.diagnostics:
            stats = {**stats, "resid_rms": _rms(x_BTD), "alpha": jnp.asarray(alpha, jnp.float32)}
        else:
            stats = None
        return x_BTD, (stats, kv_written[0])


class Andrea(nn.Module):
    cfg: ModelConfig
    impl: str = "auto"
    diagnostics: bool = False  # static: also return the per-layer stats of the scan (see Block)
    # static: logits over the padded vocabulary with the padding at the float32 minimum (the train
    # and eval steps: a slice to V would move a tensor-sharded vocabulary between devices)
    padded_logits: bool = False

    @nn.compact
    def __call__(self, tokens_BT, alphas_L, cache: KVCache | None = None):
        cfg = self.cfg
        T = tokens_BT.shape[1]
        if T > cfg.seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than model.seq_len={cfg.seq_len}")
        if cfg.family == "llama":
            llama.check_impl(self.impl)
            x_BTD, rope, head = llama.spine(self.param, cfg, tokens_BT, cache)
        else:
            x_BTD, rope, head = _gpt2_spine(self.param, cfg, tokens_BT, cache, self.impl)

        # model.remat: full saves nothing of a block (recomputes it all in the backward pass); dots
        # saves the outputs of the matmuls without batch dimensions (the qkv, output and MLP
        # projections, O(B T D) each) and recomputes the rest, the attention scores [B, H, T, T]
        # (a batched matmul) and the elementwise ops, which are cheap next to the projections.
        policy = {"full": jax.checkpoint_policies.nothing_saveable,
                  "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}.get(cfg.remat)
        block = Block if policy is None else nn.remat(Block, prevent_cse=False, policy=policy)
        stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                        in_axes=(0, nn.broadcast, nn.broadcast), length=cfg.n_layer, unroll=SCAN_UNROLL,
                        metadata_params={nn.PARTITION_NAME: "layers"})  # stacked params: ("layers", ...)
        layers_L = jnp.arange(1, cfg.n_layer + 1, dtype=jnp.int32)
        scanned = (jnp.asarray(alphas_L, jnp.float32), layers_L)
        decode = None
        if cache is not None:
            decode = (jnp.asarray(cache.index, jnp.int32), cache.valid_BS)
            scanned += (cache.k_LBSHK, cache.v_LBSHK)
        x_BTD, (stats_L, kv_L) = stack(cfg, self.impl, self.diagnostics, name="blocks")(x_BTD, scanned, decode, rope)

        logits_BTP = head(x_BTD)
        V, P = cfg.vocab_size, padded_vocab(cfg.vocab_size)
        if self.padded_logits:  # the loss's layout: padding masked out of the softmax, no slicing
            real_P = jnp.arange(P) < V
            logits_BTV = jnp.where(real_P, logits_BTP, jnp.finfo(jnp.float32).min)
        else:
            logits_BTV = logits_BTP[..., :V]
        logits_BTV = constrain(logits_BTV,
                                ("batch", "seq", "vocab"))
        return Output(logits_BTV, stats_L, kv_L)


def init_boxed(cfg: ModelConfig, rng, impl: str = "auto"):
    """The variables of a freshly initialised model, each in flax's box carrying its logical axis
    names (andrea_jax.train.sharding reads them from an eval_shape of this)."""
    tokens = jnp.zeros((1, min(8, cfg.seq_len)), jnp.int32)
    return Andrea(cfg, impl).init(rng, tokens, jnp.ones((cfg.n_layer,), jnp.float32))


def init(cfg: ModelConfig, rng, impl: str = "auto"):
    """Returns the variables of a freshly initialised model, as plain arrays."""
    return nn.unbox(init_boxed(cfg, rng, impl))


def param_shapes(cfg: ModelConfig):
    """The parameter tree as ShapeDtypeStructs, without allocating anything."""
    return jax.eval_shape(lambda rng: init(cfg, rng), jax.random.key(0))["params"]


def count_params(cfg: ModelConfig) -> int:
    return sum(int(p.size) for p in jax.tree.leaves(param_shapes(cfg)))
