"""Attention as the articles write it, in float64 NumPy: the twin the tests hold
``qkv.attention`` to on inputs no fixture covers (ALiBi, windows, bottom-right causal
with GQA, random mixes)."""

import numpy as np


def allowed(b, h, t, s, causal=None, window=None, key_padding=None, mask=None):
    """bool ``[B, H, T, S]``: which keys each query may see."""
    offset = s - t if causal == "bottom_right" else 0
    i = np.arange(t)[:, None] + offset
    j = np.arange(s)[None, :]
    ok = np.ones((b, h, t, s), dtype=bool)
    if causal:
        ok &= j <= i
    if window is not None:
        ok &= (i - j) < window
        if not causal:
            ok &= (j - i) < window
    if key_padding is not None:
        ok &= key_padding[:, None, None, :]
    if mask is not None:
        ok &= np.broadcast_to(mask, ok.shape)
    return ok


def attention(q, k, v, causal=None, window=None, key_padding=None, mask=None, bias=None,
              alibi_slopes=None, scale=None):
    """q ``[B, T, H, D]``, k ``[B, S, G, D]``, v ``[B, S, G, Dv]`` → (out ``[B, T, H, Dv]``,
    weights ``[B, H, T, S]``); a query with no visible key gets zeros."""
    b, t, h, d = q.shape
    s, g = k.shape[1], k.shape[2]
    rep = h // g
    q64 = q.astype(np.float64).transpose(0, 2, 1, 3)
    k64 = np.repeat(k.astype(np.float64).transpose(0, 2, 1, 3), rep, axis=1)
    v64 = np.repeat(v.astype(np.float64).transpose(0, 2, 1, 3), rep, axis=1)
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    scores = q64 @ k64.transpose(0, 1, 3, 2) * scale
    if bias is not None:
        scores = scores + np.broadcast_to(bias.astype(np.float64), scores.shape)
    if alibi_slopes is not None:
        offset = s - t if causal == "bottom_right" else 0
        dist = np.arange(s)[None, :] - (np.arange(t)[:, None] + offset)
        scores = scores + alibi_slopes.astype(np.float64)[None, :, None, None] * dist
    ok = allowed(b, h, t, s, causal, window, key_padding, mask) & np.isfinite(scores)
    scores = np.where(ok, scores, -np.inf)
    top = np.max(np.where(ok, scores, -np.inf), axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.where(ok, np.exp(scores - top), 0.0)
    total = e.sum(-1, keepdims=True)
    weights = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)
    out = (weights @ v64).transpose(0, 2, 1, 3)
    return out.astype(np.float32), weights.astype(np.float32)
