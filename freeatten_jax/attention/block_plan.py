"""Which (query block, key block) pairs to visit, for blockwise, the ring and the Pallas kernels: one planner.

Glossary: B batch, I / J number of query / key blocks, Q / C their lengths. Arguments are a Mask (its
causal and window rules) and its arrays in blocks, [B, I, Q] for the queries and [B, J, C] for the keys.
A pair may be skipped only when positions, segments, padding or the window rule out every (query, key)
pair in it (maybe_visible); a pair is interior, free of any mask, only when every pair in it is visible
(fully_visible: one segment, no padding, wholly below the causal diagonal, inside the window).
"""

import jax
import jax.numpy as jnp

from freeatten_jax.attention.variants import Mask


def _range(x_BXY, valid_BXY):
    """Min and max over each block's valid entries ([B, X])."""
    big = jnp.iinfo(jnp.int32).max
    return jnp.min(jnp.where(valid_BXY, x_BXY, big), axis=2), jnp.max(jnp.where(valid_BXY, x_BXY, -big), axis=2)


def maybe_visible(mask: Mask, qpos_BIQ, qseg_BIQ, kpos_BJC, kseg_BJC, kvalid_BJC) -> jax.Array:
    """[B, I, J] bool: False only when no (query, key) pair of the two blocks can be visible."""
    every = jnp.ones(qpos_BIQ.shape, bool)
    (q_lo, q_hi), (qs_lo, qs_hi) = _range(qpos_BIQ, every), _range(qseg_BIQ, every)
    (k_lo, k_hi), (ks_lo, ks_hi) = _range(kpos_BJC, kvalid_BJC), _range(kseg_BJC, kvalid_BJC)
    q_lo, q_hi, qs_lo, qs_hi = (x[:, :, None] for x in (q_lo, q_hi, qs_lo, qs_hi))
    k_lo, k_hi, ks_lo, ks_hi = (x[:, None, :] for x in (k_lo, k_hi, ks_lo, ks_hi))
    maybe = jnp.any(kvalid_BJC, axis=2)[:, None, :] & (ks_lo <= qs_hi) & (qs_lo <= ks_hi)
    if mask.causal:
        maybe &= k_lo <= q_hi
    if mask.window is not None:
        maybe &= (k_lo - q_hi < mask.window) & (q_lo - k_hi < mask.window)
    return maybe


def fully_visible(mask: Mask, qpos_BIQ, qseg_BIQ, kpos_BJC, kseg_BJC, kvalid_BJC) -> jax.Array:
    """[B, I, J] bool: True only when every (query, key) pair of the two blocks is visible."""
    every_q, every_k = jnp.ones(qpos_BIQ.shape, bool), jnp.ones(kpos_BJC.shape, bool)
    (q_lo, q_hi), (qs_lo, qs_hi) = _range(qpos_BIQ, every_q), _range(qseg_BIQ, every_q)
    (k_lo, k_hi), (ks_lo, ks_hi) = _range(kpos_BJC, every_k), _range(kseg_BJC, every_k)
    q_lo, q_hi, qs_lo, qs_hi = (x[:, :, None] for x in (q_lo, q_hi, qs_lo, qs_hi))
    k_lo, k_hi, ks_lo, ks_hi = (x[:, None, :] for x in (k_lo, k_hi, ks_lo, ks_hi))
    full = jnp.all(kvalid_BJC, axis=2)[:, None, :] & (qs_lo == qs_hi) & (ks_lo == ks_hi) & (qs_lo == ks_lo)
    if mask.causal:
        full &= k_hi <= q_lo
    if mask.window is not None:
        full &= (q_hi - k_lo < mask.window) & (k_hi - q_lo < mask.window)
    return full
