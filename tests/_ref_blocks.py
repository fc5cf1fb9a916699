"""Direct jnp transcriptions of the ProRes paper's block formulas (Table 1), independent of andrea_jax.model's code
path (no flax, no kernels): the reference of tests/test_variants.py and tests/test_diagnostics.py,
and with family="llama" of tests/test_llama.py (RMSNorm, no biases, SwiGLU, RoPE written with
complex numbers, an untied head).
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


def rms_norm(x, p, name, eps=1e-5):
    return x / jnp.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * p[f"{name}_scale"]


def rope(x_BTHK, positions_BT, theta=10000.0):
    """RoPE as complex rotations: pair i of a head is (x_i, x_{i + K/2}) (HF Llama's rotate_half
    layout), as the complex number x_i + j x_{i + K/2}, multiplied by exp(j pos theta^(-2i/K))."""
    K = x_BTHK.shape[-1]
    z = x_BTHK[..., :K // 2] + 1j * x_BTHK[..., K // 2:]
    freq = theta ** (-jnp.arange(K // 2) * 2.0 / K)
    z = z * jnp.exp(1j * positions_BT[:, :, None, None] * freq)
    return jnp.concatenate([z.real, z.imag], axis=-1)


def llama_attention(p, y, n_head, positions_BT):
    B, T, D = y.shape
    K = D // n_head
    qkv = y @ p["attn_qkv_kernel"]
    q, k, v = (qkv[..., i * D:(i + 1) * D].reshape(B, T, n_head, K) for i in range(3))
    q, k = rope(q, positions_BT), rope(k, positions_BT)
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(K)
    causal = jnp.tril(jnp.ones((T, T), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
    return (weights @ v).transpose(0, 2, 1, 3).reshape(B, T, D) @ p["attn_out_kernel"]


def swiglu(p, y):
    gate = y @ p["mlp_gate_kernel"]
    return (gate * jax.nn.sigmoid(gate) * (y @ p["mlp_up_kernel"])) @ p["mlp_proj_kernel"]


def block(norm, p, x, a, l, L, n_head, family="gpt2"):
    """One block of the paper's Table 1. Returns (x_out, [(a * F, skip) for attn, mlp])."""
    if family == "llama":
        positions_BT = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
        N = lambda name, v: rms_norm(v, p, name)
        Attn = lambda v: llama_attention(p, v, n_head, positions_BT)
        MLP = lambda v: swiglu(p, v)
    else:
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


def forward(norm, params, tokens, alphas, n_head, family="gpt2"):
    """The whole model as a Python loop over per-layer slices. Returns (logits, per-layer stats)."""
    L = len(alphas)
    T = tokens.shape[1]
    x = params["tok_embedding"][tokens]
    if family == "gpt2":
        x = x + params["pos_embedding"][:T]
    stats = {"resid_rms": [], "attn_ratio": [], "mlp_ratio": []}
    for i in range(L):
        p = jax.tree.map(lambda v: v[i], params["blocks"])
        a = alphas[i] * p.get("residual_gate", 1.0)
        x, branches = block(norm, p, x, a, i + 1, L, n_head, family)
        stats["resid_rms"].append(jnp.sqrt(jnp.mean(x ** 2)))
        for name, (f, skip) in zip(("attn_ratio", "mlp_ratio"), branches):
            stats[name].append(jnp.linalg.norm(f.ravel()) / jnp.linalg.norm(skip.ravel()))
    if family == "llama":
        logits = rms_norm(x, params, "lnf") @ params["lm_head_kernel"]
    else:
        logits = layer_norm(x, params, "lnf") @ params["tok_embedding"].T
    return logits, {k: jnp.stack(v) for k, v in stats.items()}
