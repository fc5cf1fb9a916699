"""The next-token cross-entropy and the z-loss's mean squared log-normaliser computed from the head's
operands a chunk of positions at a time (model.loss_chunks), so that neither the float32 logits
[B, T, P] nor their gradient is ever held whole: at andrea_120m's 64 x 1024 rows each is 2.2 GB.

The forward keeps one float32 per position (its log-normaliser); the backward recomputes a chunk's
logits from the final norm's output y and the head w to form their gradient, and accumulates the
head's gradient over the chunks in float32. Numerics as the plain path's (model.layers.logits_matmul,
then train.steps.cross_entropy and z_loss_term): compute-dtype operands and float32 logits, the
padded vocabulary at the float32 minimum, the logits' cotangent cast to the compute dtype before the
two backward matmuls, which accumulate in float32.

Chunks split each row's T positions, not the rows: every chunk holds all B rows, so a batch split
over devices stays split the same way in every chunk.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from andrea_jax.model.layers import token_matmul


def check_chunks(T: int, chunks: int) -> None:
    """Refuses a chunk count that does not divide the positions (the config checks seq_len alike)."""
    if chunks < 1 or T % chunks:
        raise ValueError(f"model.loss_chunks={chunks} must divide the {T} positions of a row")


def losses(y_BTD, w_DP, targets_BT, vocab_size: int, chunks: int, unroll: int | bool = 1):
    """(mean cross-entropy, mean squared log-normaliser) of logits y @ w over the first vocab_size
    of the P columns; z-loss is its coefficient times the second. unroll: the chunk loops' (True
    for XLA's cost analysis, which counts a loop's body once, as the model's scan_unroll)."""
    check_chunks(y_BTD.shape[1], chunks)
    return _losses(y_BTD, w_DP, targets_BT, vocab_size, chunks, unroll)


def _split(a_BT_, chunks: int):
    """[B, T, ...] -> [chunks, B, T / chunks, ...]: chunk c holds positions c T / chunks onwards."""
    B, T, *rest = a_BT_.shape
    return jnp.moveaxis(a_BT_.reshape(B, chunks, T // chunks, *rest), 1, 0)


def _join(a_CBt_):
    """The inverse of _split."""
    C, B, t, *rest = a_CBt_.shape
    return jnp.moveaxis(a_CBt_, 0, 1).reshape(B, C * t, *rest)


def _logits(y_BtD, w_DP, vocab_size: int):
    """A chunk's float32 logits [B, t, P], the padding columns at the float32 minimum."""
    logits_BtP = token_matmul(y_BtD, w_DP, preferred_element_type=jnp.float32)
    real_P = jnp.arange(w_DP.shape[1]) < vocab_size
    return jnp.where(real_P, logits_BtP, jnp.finfo(jnp.float32).min)


def _chunk_forward(w_DP, vocab_size: int, y_BtD, targets_Bt):
    """(cross-entropy, log-normaliser) of each position of a chunk, as optax and logsumexp form them."""
    logits_BtP = _logits(y_BtD, w_DP, vocab_size)
    max_Bt = jnp.max(logits_BtP, axis=-1)
    shifted_BtP = logits_BtP - max_Bt[..., None]
    log_sum_Bt = jnp.log(jnp.sum(jnp.exp(shifted_BtP), axis=-1))
    target_Bt = jnp.take_along_axis(shifted_BtP, targets_Bt[..., None], axis=-1)[..., 0]
    return log_sum_Bt - target_Bt, max_Bt + log_sum_Bt


def _forward(y_BTD, w_DP, targets_BT, vocab_size: int, chunks: int, unroll):
    step = lambda _, xs: (None, _chunk_forward(w_DP, vocab_size, *xs))
    xs = (_split(y_BTD, chunks), _split(targets_BT, chunks))
    _, (ce_CBt, lse_CBt) = jax.lax.scan(step, None, xs, unroll=unroll)
    return (jnp.mean(ce_CBt), jnp.mean(jnp.square(lse_CBt))), lse_CBt


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _losses(y_BTD, w_DP, targets_BT, vocab_size: int, chunks: int, unroll):
    return _forward(y_BTD, w_DP, targets_BT, vocab_size, chunks, unroll)[0]


def _losses_fwd(y_BTD, w_DP, targets_BT, vocab_size: int, chunks: int, unroll):
    out, lse_CBt = _forward(y_BTD, w_DP, targets_BT, vocab_size, chunks, unroll)
    return out, (y_BTD, w_DP, targets_BT, lse_CBt)


def _logits_cotangent(logits_BtP, targets_Bt, lse_Bt, g_ce, g_sq, n: int):
    """d(g_ce mean ce + g_sq mean lse^2) / d logits: softmax minus the target's one-hot, and the
    squared log-normaliser's 2 lse softmax, each over the n positions of the batch."""
    p_BtP = jnp.exp(logits_BtP - lse_Bt[..., None])
    onehot_BtP = jax.nn.one_hot(targets_Bt, logits_BtP.shape[-1], dtype=jnp.float32)
    return (g_ce / n) * (p_BtP - onehot_BtP) + (g_sq * 2.0 / n) * lse_Bt[..., None] * p_BtP


def _losses_bwd(vocab_size: int, chunks: int, unroll, res, g):
    y_BTD, w_DP, targets_BT, lse_CBt = res
    g_ce, g_sq = g
    n = targets_BT.size

    def step(dw_DP, xs):
        y_BtD, targets_Bt, lse_Bt = xs
        dlogits_BtP = _logits_cotangent(_logits(y_BtD, w_DP, vocab_size), targets_Bt, lse_Bt, g_ce, g_sq, n)
        dlogits_BtP = dlogits_BtP.astype(y_BtD.dtype)
        dy_BtD = token_matmul(dlogits_BtP, w_DP.T, preferred_element_type=jnp.float32).astype(y_BtD.dtype)
        D, P = w_DP.shape
        dw_DP = dw_DP + jnp.tensordot(y_BtD.reshape(-1, D), dlogits_BtP.reshape(-1, P), axes=((0,), (0,)),
                                      preferred_element_type=jnp.float32)
        return dw_DP, dy_BtD

    xs = (_split(y_BTD, chunks), _split(targets_BT, chunks), lse_CBt)
    dw_DP, dy_CBtD = jax.lax.scan(step, jnp.zeros(w_DP.shape, jnp.float32), xs, unroll=unroll)
    return _join(dy_CBtD), dw_DP.astype(w_DP.dtype), None


_losses.defvjp(_losses_fwd, _losses_bwd)
