"""The reference implementation: materialise the [B, H, T, S] weights, float32 throughout.

Glossary: B batch, T queries, S keys, H query heads, K key/value heads, G = H // K, D head dim.
"""

import jax
import jax.numpy as jnp

from freeatten_jax.attention.variants import NEG_INF, REWEIGHT_MARGIN, Mask, Variant, hide_unseen, reweight_offset

_HIGHEST = jax.lax.Precision.HIGHEST
_TINY = float(jnp.finfo(jnp.float32).tiny)


def _softmax(scores, visible, n, opts, weight):
    return jax.nn.softmax(jnp.where(visible, scores, NEG_INF), axis=-1) * visible


def _sum(scores, visible, n, opts, weight):
    u = jnp.where(visible, weight(scores, n), 0.0)
    return u / jnp.maximum(jnp.sum(u, axis=-1, keepdims=True), _TINY)


def _none(scores, visible, n, opts, weight):
    return jnp.where(visible, weight(scores, n), 0.0)


def _reweight(scores, visible, n, opts, weight):
    """LSSAR: softmax_j(p log relu(N_i A0_ij - o_i)), i.e. relu(.)^p / sum, without overflow."""
    a0 = _sum(scores, visible, n, opts, weight)
    x = n * a0 - reweight_offset(n)
    above = visible & (x > 0)
    logits = jnp.where(above, opts["p"] * jnp.log(jnp.where(above, x, 1.0)), NEG_INF)
    a = jax.nn.softmax(logits, axis=-1) * above
    sharp = jnp.max(jnp.where(visible, x, -1.0), axis=-1, keepdims=True) > REWEIGHT_MARGIN
    return jnp.where(sharp, a, a0)  # nothing clearly above uniform: keep LSSA


NORMALISERS = {"softmax": _softmax, "sum": _sum, "none": _none, "reweight": _reweight}


def _weights(q_BTHD, k_BSKD, v_BSKD, variant: Variant, mask: Mask, opts):
    """The weights A as [B, H, T, S] float32, and v with its unseen rows zeroed (hide_unseen).

    The visibility is [B, H or 1, T, S] (H for a per-head mask); so is N_i = its row sum."""
    visible_BHTS = mask.visible()
    n_BHT = jnp.sum(visible_BHTS, axis=-1)
    k_BSKD, v_BSKD = hide_unseen(k_BSKD, v_BSKD, jnp.any(visible_BHTS, axis=2))
    q_BTHD, k_BSKD = variant.prepare(q_BTHD, k_BSKD, n_BHT, opts)
    b, t, h, d = q_BTHD.shape
    s, kv_heads = k_BSKD.shape[1], k_BSKD.shape[2]
    q_BTKGD = q_BTHD.reshape(b, t, kv_heads, h // kv_heads, d)
    scores_BKGTS = jnp.einsum("BTKGD,BSKD->BKGTS", q_BTKGD, k_BSKD, precision=_HIGHEST)
    scores_BHTS = scores_BKGTS.reshape(b, h, t, s)
    normalise = NORMALISERS[variant.rule(opts)]
    n_BHT1 = n_BHT[..., None].astype(jnp.float32)
    return normalise(scores_BHTS, visible_BHTS, n_BHT1, opts, variant.weight), v_BSKD


def weights(q_BTHD, k_BSKD, *, variant: Variant, mask: Mask, opts) -> jax.Array:
    """The attention weights A as [B, H, T, S] float32."""
    return _weights(q_BTHD, k_BSKD, k_BSKD, variant, mask, opts)[0]


def attend(q_BTHD, k_BSKD, v_BSKD, *, variant: Variant, mask: Mask, opts) -> jax.Array:
    """o_i = sum_j A_ij v_j, computed in float32 and cast back to q's dtype."""
    w_BHTS, v_BSKD = _weights(q_BTHD, k_BSKD, v_BSKD, variant, mask, opts)
    b, h, t, s = w_BHTS.shape
    kv_heads = k_BSKD.shape[2]
    w_BKGTS = w_BHTS.reshape(b, kv_heads, h // kv_heads, t, s)
    out_BTKGD = jnp.einsum("BKGTS,BSKD->BTKGD", w_BKGTS, v_BSKD.astype(jnp.float32), precision=_HIGHEST)
    return out_BTKGD.reshape(b, t, h, -1).astype(q_BTHD.dtype)
