"""The mask in blocks, and which (query block, key block) pairs to visit, for blockwise, the ring and the Pallas
kernels: one planner.

Glossary: B batch, I / J number of query / key blocks, Q / C their lengths. Arguments are a Mask (its
causal and window rules) and its arrays in blocks, [B, I, Q] for the queries and [B, J, C] for the keys.
A pair may be skipped only when positions, segments, padding or the window rule out every (query, key)
pair in it (maybe_visible); a pair is interior, free of any mask, only when every pair in it is visible
(fully_visible: one segment, no padding, wholly below the causal diagonal, inside the window).
"""

import dataclasses

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


def _blocks(x_BL, size: int, fill) -> jax.Array:
    """[B, L] -> [L / size, B, size], padding the tail with `fill` (None: repeat the last entry)."""
    pad = -x_BL.shape[1] % size
    mode = dict(mode="edge") if fill is None else dict(constant_values=fill)
    x_BL = jnp.pad(x_BL, ((0, 0), (0, pad)), **mode)
    return x_BL.reshape(x_BL.shape[0], -1, size).transpose(1, 0, 2)


def _dense_blocks(dense_BHTS, size: int, q_size: int):
    """[B, H, T, S] -> [J, B, H, T', C] (T' = T padded to a multiple of q_size), padded with False."""
    if dense_BHTS is None:
        return None
    b, h, t, s = dense_BHTS.shape
    dense_BHTS = jnp.pad(dense_BHTS, ((0, 0), (0, 0), (0, -t % q_size), (0, -s % size)))
    return dense_BHTS.reshape(b, h, dense_BHTS.shape[2], -1, size).transpose(3, 0, 1, 2, 4)


def kv_mask_blocks(mask: Mask, size: int, q_size: int = 1) -> Mask:
    """The key-side mask arrays as [J, B, C]; padding keys are invalid."""
    return dataclasses.replace(
        mask,
        kv_positions=_blocks(mask.kv_positions, size, None),
        kv_segment_ids=_blocks(mask.kv_segment_ids, size, None),
        kv_valid=_blocks(mask.kv_valid, size, False),
        dense=_dense_blocks(mask.dense, size, q_size),
    )


def q_mask_blocks(mask: Mask, size: int) -> Mask:
    """The query-side mask arrays as [I, B, Q]; padding queries repeat the last one."""
    return dataclasses.replace(
        mask, q_positions=_blocks(mask.q_positions, size, None), q_segment_ids=_blocks(mask.q_segment_ids, size, None)
    )


def count_visible(mask: Mask, block_k: int):
    """N_i = Σ_j M_ij as [B, H or 1, T] int32, and whether any query sees key j as [B, H or 1, S],
    one key block at a time (never a T x S array unless the mask is dense)."""
    kv_mask = kv_mask_blocks(mask, block_k)

    def add_block(n_BHT, kv_block):
        visible_BHTC = dataclasses.replace(mask, **kv_block).visible()
        return n_BHT + jnp.sum(visible_BHTC, axis=-1, dtype=jnp.int32), jnp.any(visible_BHTC, axis=2)

    names = ("kv_positions", "kv_segment_ids", "kv_valid", "dense")
    (b, t), heads = mask.q_positions.shape, 1 if mask.dense is None else mask.dense.shape[1]
    n_BHT, seen_JBHC = jax.lax.scan(add_block, jnp.zeros((b, heads, t), jnp.int32), {n: getattr(kv_mask, n) for n in names})
    seen_BHS = seen_JBHC.transpose(1, 2, 0, 3).reshape(b, heads, -1)[:, :, : mask.kv_positions.shape[1]]
    return n_BHT, seen_BHS
