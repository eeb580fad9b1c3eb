"""A float64 NumPy oracle for docs/method.md §2, written from docs/method.md and independent of the library.

Glossary: B batch, T queries, S keys, H query heads, K key/value heads, D head dim.
"""

import numpy as np


def visible(q_pos, kv_pos, q_seg, kv_seg, kv_valid, causal=True, window=None):
    """M_ij by explicit loops over [B, T] / [B, S] arrays."""
    (batch, t), s = q_pos.shape, kv_pos.shape[1]
    m = np.zeros((batch, t, s), bool)
    for b in range(batch):
        for i in range(t):
            for j in range(s):
                ok = q_seg[b, i] == kv_seg[b, j] and kv_valid[b, j]
                if causal:
                    ok = ok and kv_pos[b, j] <= q_pos[b, i]
                if window is not None:
                    ok = ok and abs(int(q_pos[b, i]) - int(kv_pos[b, j])) < window
                m[b, i, j] = ok
    return m


def _row_normalise(u):
    total = u.sum(-1, keepdims=True)
    return np.divide(u, total, out=np.zeros_like(u), where=total > 0)


def _masked_softmax(logits, m):
    logits = np.where(m, logits, -np.inf)
    top = np.max(logits, -1, keepdims=True)
    e = np.where(m, np.exp(logits - np.where(np.isfinite(top), top, 0.0)), 0.0)
    return _row_normalise(e)


def _per_head(x, h):
    return np.broadcast_to(np.asarray(x, np.float64), (h,))[None, :, None, None]


def _softmax(c):
    return _masked_softmax(c["dots"] / np.sqrt(c["d"]), c["m"])


def _ssmax(c):
    factor = _per_head(c["s"], c["h"]) * c["logn"]
    if c["b"] is not None:
        factor = factor + _per_head(c["b"], c["h"])
    return _masked_softmax(factor * c["dots"] / np.sqrt(c["d"]), c["m"])


def _lssa(c):
    log_n = c["logn"] if c["temperature_length"] is None else np.log(c["temperature_length"])
    z = np.log(c["d"]) * log_n * c["cos"]
    return _row_normalise(np.log1p(np.exp(z)) * c["m"])


def _lssar(c):
    a0 = _lssa(c)
    if c["p"] is None:
        return a0
    x = c["n"] * a0 - np.where(c["n"] > 3, 1.0, 0.0)
    r = np.maximum(x, 0.0) ** c["p"] * c["m"]
    sharp = np.max(np.where(c["m"] > 0, x, -1.0), -1, keepdims=True) > 2.0**-10
    return np.where(sharp, _row_normalise(r), a0)


def _sigmoid(c):
    return c["m"] / (1.0 + np.exp(-(c["dots"] / np.sqrt(c["d"]) - c["logn"])))


def _relu(c):
    return np.maximum(c["dots"] / np.sqrt(c["d"]), 0.0) * c["m"] / np.maximum(c["n"], 1)


ORACLES = {"softmax": _softmax, "ssmax": _ssmax, "lssa": _lssa, "lssar": _lssar, "sigmoid": _sigmoid, "relu": _relu}


def weights(q, k, m, variant, s=1.0, b=None, p=15.0, temperature_length=None):
    """A as [B, H, T, S] float64; q [B,T,H,D], k [B,S,K,D], m [B,T,S] bool."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    h, d = q.shape[2], q.shape[3]
    k = np.repeat(k, h // k.shape[2], axis=2)
    n = m.sum(-1)[:, None, :, None].astype(np.float64)
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-6)  # a zero row stays zero
    case = {
        "dots": np.einsum("bthd,bshd->bhts", q, k),
        "cos": np.einsum("bthd,bshd->bhts", unit(q), unit(k)),
        "m": m[:, None].astype(np.float64),
        "n": n,
        "logn": np.log(np.maximum(n, 1)),
        "d": d,
        "h": h,
        "s": s,
        "b": b,
        "p": p,
        "temperature_length": temperature_length,
    }
    return ORACLES[variant](case)


def attend(q, k, v, m, variant, **options):
    """o = A v as [B, T, H, D] float64."""
    a = weights(q, k, m, variant, **options)
    v = np.repeat(np.asarray(v, np.float64), q.shape[2] // v.shape[2], axis=2)
    return np.einsum("bhts,bshd->bthd", a, v)
