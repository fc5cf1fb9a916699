"""The placements of the paper's Table 1 (pre, post, sandwich, deepnorm, lns) over a family's sublayers
(FAMILIES: gpt2.py, llama.py), `Block` (one layer, the scan's body) and `Andrea`, the model:
`Andrea(cfg).apply(variables, tokens_BT, alphas_L) -> Output(logits, stats, kv)`. The contract, the
KV cache and the float32 residual stream are described in docs/ARCHITECTURE.md, section "Numerics".
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import typing
from typing import Callable

import jax
import jax.numpy as jnp
import flax.linen as nn

from andrea_jax import names
from andrea_jax.config import NORMS, ModelConfig
from andrea_jax.model.layers import STREAM_BTD, KVCache, constrain, logits_matmul, padded_vocab

OUTPUT_PROJECTIONS = ("attn_out_kernel", "mlp_proj_kernel")


class HeadOperands(typing.NamedTuple):
    """The logits' two operands over the padded vocabulary, for a loss that never holds the logits."""
    y_BTD: jax.Array            # the final norm's output
    w_DP: jax.Array             # the head (the tied embedding, transposed, or the untied head)


class Output(typing.NamedTuple):
    """What `Andrea.__call__` returns, whatever it is asked for: three fields, so that
    `logits, stats, kv = model.apply(...)` holds in every mode."""
    logits: jax.Array | HeadOperands  # [B, T, V] float32 (the padded vocabulary with padded_logits);
                                      # with head_operands=True, their HeadOperands instead
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
# model.family -> its module, andrea_jax/model/<family>.py, for each name in names.FAMILIES. What
# the generic code asks of a family is there, each with one signature:
#   block_sublayers(matrix, vector, cfg, norm_names, impl, cache, rope, segment_ids_BT)
#       -> (attend, mlp, norm, residual_norm)
#   spine(param, cfg, tokens_BT, cache, impl, positions_BT) -> (x_BTD, rope, head)
#   BLOCK_PARAM_AXES: name -> logical axes of the block parameters it creates (Block's factories)
#   decays(path_names) -> bool: weight decay's rule (train/optim.decay_mask)
#   MLP_MATRICES: the number of D x F matrices of its MLP (train/mfu)
#   HF_* tables, hf_config(model_cfg), hf_checked(model_cfg): its Hugging Face architecture (model/hf.py)
# block_sublayers creates a block's parameters through Block's factories; spine the embedding,
# positions, final norm and head (rope: what every block's attention shares, None for gpt2;
# head(x_BTD) -> (y_BTD, w_DP), the logits' operands in the compute dtype).
FAMILIES = {name: importlib.import_module(f"andrea_jax.model.{name}") for name in names.FAMILIES}


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
    def __call__(self, x_BTD, scanned, decode=None, rope=None, segment_ids_BT=None):
        """scanned: (alpha, l), plus this layer's (k_BSHK, v_BSHK) cache when decoding; decode:
        None, or (index, valid_BS) shared by every layer; rope: llama's (cos, sin) tables, shared
        too (None for gpt2); segment_ids_BT: data.document_mask's document ids, or None. Returns
        (x, (stats, kv)): kv is None without a cache, else this layer's (k_BSHK, v_BSHK) with the
        call's slots written."""
        alpha, layer = scanned[:2]
        kv_written = []
        cfg, impl = self.cfg, self.impl

        family = FAMILIES[cfg.family]

        def matrix(name, shape):
            zero = cfg.zero_init_out and name in OUTPUT_PROJECTIONS  # the block starts as the identity
            init = nn.initializers.zeros if zero else _normal(_kernel_std(cfg, name, shape, layer))
            init = nn.with_logical_partitioning(init, family.BLOCK_PARAM_AXES[name])
            return self.param(name, init, shape, jnp.float32)

        def vector(name, init, size):
            axes = family.BLOCK_PARAM_AXES.get(name, ("act_embed",))  # norm gains and biases: the stream's width
            return self.param(name, nn.with_logical_partitioning(init, axes), (size,), jnp.float32)

        cache = None if decode is None else (*scanned[2:], *decode)
        attend, mlp, norm, residual_norm = family.block_sublayers(matrix, vector, cfg, NORM_NAMES[cfg.norm], impl,
                                                                  cache, rope, segment_ids_BT)
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
    """The model: the family's spine around one `nn.scan` of `Block` over the layers."""
    cfg: ModelConfig
    impl: str = "auto"
    diagnostics: bool = False  # static: also return the per-layer stats of the scan (see Block)
    # static: logits over the padded vocabulary with the padding at the float32 minimum (the train
    # and eval steps: a slice to V would move a tensor-sharded vocabulary between devices)
    padded_logits: bool = False
    # static: return the logits' operands (HeadOperands) in Output.logits instead of the logits, for a loss that
    # forms the logits a chunk at a time (model.loss_chunks, andrea_jax.train.chunked_loss)
    head_operands: bool = False
    # lax.scan's `unroll` of the block stack: 1 is a loop. XLA's cost analysis counts a loop's body
    # once, so andrea_jax.aot counts FLOPs on a program built with True (fully unrolled).
    scan_unroll: int | bool = 1

    @nn.compact
    def __call__(self, tokens_BT, alphas_L, cache: KVCache | None = None, segment_ids_BT=None, positions_BT=None):
        """segment_ids_BT: data.document_mask's int32 document ids (attention stays within each);
        positions_BT: model.reset_positions' positions within each document. Both None by default."""
        cfg = self.cfg
        T = tokens_BT.shape[1]
        if T > cfg.seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than model.seq_len={cfg.seq_len}")
        x_BTD, rope, head = FAMILIES[cfg.family].spine(self.param, cfg, tokens_BT, cache, self.impl, positions_BT)

        # model.remat: full saves nothing of a block (recomputes it all in the backward pass); dots
        # saves the outputs of the matmuls without batch dimensions (the qkv, output and MLP
        # projections, O(B T D) each) and recomputes the rest, the attention scores [B, H, T, T]
        # (a batched matmul) and the elementwise ops, which are cheap next to the projections.
        policy = {"full": jax.checkpoint_policies.nothing_saveable,
                  "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}.get(cfg.remat)
        block = Block if policy is None else nn.remat(Block, prevent_cse=False, policy=policy)
        stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                        in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast), length=cfg.n_layer,
                        unroll=self.scan_unroll,
                        metadata_params={nn.PARTITION_NAME: "layers"})  # stacked params: ("layers", ...)
        layers_L = jnp.arange(1, cfg.n_layer + 1, dtype=jnp.int32)
        scanned = (jnp.asarray(alphas_L, jnp.float32), layers_L)
        decode = None
        if cache is not None:
            decode = (jnp.asarray(cache.index, jnp.int32), cache.valid_BS)
            scanned += (cache.k_LBSHK, cache.v_LBSHK)
        x_BTD, (stats_L, kv_L) = stack(cfg, self.impl, self.diagnostics, name="blocks")(x_BTD, scanned, decode, rope,
                                                                                        segment_ids_BT)

        y_BTD, w_DP = head(x_BTD)
        if self.head_operands:
            return Output(HeadOperands(y_BTD, w_DP), stats_L, kv_L)
        logits_BTP = logits_matmul(y_BTD, w_DP)
        V, P = cfg.vocab_size, padded_vocab(cfg.vocab_size)
        if self.padded_logits:  # the loss's layout: padding masked out of the softmax, no slicing
            real_P = jnp.arange(P) < V
            logits_BTV = jnp.where(real_P, logits_BTP, jnp.finfo(jnp.float32).min)
        else:
            logits_BTV = logits_BTP[..., :V]
        logits_BTV = constrain(logits_BTV,
                                ("batch", "seq", "vocab"))
        return Output(logits_BTV, stats_L, kv_L)


@functools.partial(jax.jit, static_argnames=("cfg", "impl"))
def init_boxed(cfg: ModelConfig, rng, impl: str = "auto"):
    """The variables of a freshly initialised model, each in flax's box carrying its logical axis
    names (andrea_jax.train.sharding reads them from an eval_shape of this). Jitted: flax's init
    runs the forward pass, which op by op would compile each of its operations on its own."""
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
