"""Direct jnp transcriptions of the ProRes paper's block formulas (Table 1), independent of andrea_jax.model's code
path (no flax, no kernels): the reference of tests/test_variants.py and tests/test_diagnostics.py.
"""
import math

import jax
import jax.numpy as jnp


def layer_norm(x, p, name, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * p[f"{name}_scale"] + p[f"{name}_bias"]


def gelu(u):
    return 0.5 * u * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u ** 3)))


def attention(p, y, n_head):
    B, T, D = y.shape
    K = D // n_head
    qkv = y @ p["attn_qkv_kernel"] + p["attn_qkv_bias"]
    q, k, v = (qkv[..., i * D:(i + 1) * D].reshape(B, T, n_head, K).transpose(0, 2, 1, 3) for i in range(3))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(K)
    causal = jnp.tril(jnp.ones((T, T), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
    o = (weights @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
    return o @ p["attn_out_kernel"] + p["attn_out_bias"]


def mlp(p, y):
    return gelu(y @ p["mlp_fc_kernel"] + p["mlp_fc_bias"]) @ p["mlp_proj_kernel"] + p["mlp_proj_bias"]


def block(norm, p, x, a, l, L, n_head):
    """One block of the paper's Table 1. Returns (x_out, [(a * F, skip) for attn, mlp])."""
    N = lambda name, v: layer_norm(v, p, name)
    Attn = lambda v: attention(p, v, n_head)
    MLP = lambda v: mlp(p, v)
    if norm == "pre":        # x + a F(Norm(x))
        f1 = a * Attn(N("ln1", x)); h = x + f1
        f2 = a * MLP(N("ln2", h)); out = h + f2
        return out, [(f1, x), (f2, h)]
    if norm == "post":       # Norm(x + a F(x))
        f1 = a * Attn(x); h = N("ln1", x + f1)
        f2 = a * MLP(h); out = N("ln2", h + f2)
        return out, [(f1, x), (f2, h)]
    if norm == "sandwich":   # x + a Norm(F(Norm(x)))
        f1 = a * N("ln1_out", Attn(N("ln1", x))); h = x + f1
        f2 = a * N("ln2_out", MLP(N("ln2", h))); out = h + f2
        return out, [(f1, x), (f2, h)]
    if norm == "deepnorm":   # Norm(c x + a F(x)), c = (2L)^(1/4)
        c = (2 * L) ** 0.25
        f1 = a * Attn(x); h = N("ln1", c * x + f1)
        f2 = a * MLP(h); out = N("ln2", c * h + f2)
        return out, [(f1, c * x), (f2, c * h)]
    if norm == "lns":        # x + a F(Norm(x) / sqrt(l))
        f1 = a * Attn(N("ln1", x) / math.sqrt(l)); h = x + f1
        f2 = a * MLP(N("ln2", h) / math.sqrt(l)); out = h + f2
        return out, [(f1, x), (f2, h)]
    raise ValueError(norm)


def forward(norm, params, tokens, alphas, n_head):
    """The whole model as a Python loop over per-layer slices. Returns (logits, per-layer stats)."""
    L = len(alphas)
    T = tokens.shape[1]
    x = params["tok_embedding"][tokens] + params["pos_embedding"][:T]
    stats = {"resid_rms": [], "attn_ratio": [], "mlp_ratio": []}
    for i in range(L):
        p = jax.tree.map(lambda v: v[i], params["blocks"])
        a = alphas[i] * p.get("residual_gate", 1.0)
        x, branches = block(norm, p, x, a, i + 1, L, n_head)
        stats["resid_rms"].append(jnp.sqrt(jnp.mean(x ** 2)))
        for name, (f, skip) in zip(("attn_ratio", "mlp_ratio"), branches):
            stats[name].append(jnp.linalg.norm(f.ravel()) / jnp.linalg.norm(skip.ravel()))
    y = layer_norm(x, params, "lnf")
    return y @ params["tok_embedding"].T, {k: jnp.stack(v) for k, v in stats.items()}
