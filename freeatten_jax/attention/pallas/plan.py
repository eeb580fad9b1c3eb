"""The Pallas kernels' view of a Mask: its arrays in kernel layouts, and the spans of block pairs to visit.

Glossary: B batch, T / S query / key length (padded to Tp / Sp), Q / C query / key block length,
I / J number of query / key blocks. Block skipping is decided per batch row: a pair (i, j) is
visited only between the first and last key block that may hold a visible pair for query block i
(and, backward, between the first and last such query block for key block j); a pair is skipped
only when positions, segments, padding or the window rule out every (query, key) pair in it. Inside
that span, a run of pairs where every (query, key) pair is visible (interior blocks: one segment, no
padding, wholly below the causal diagonal, inside the window) takes the kernels' mask-free path.
Which pairs may be visible and which are interior is block_plan's (shared with blockwise and the ring).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from freeatten_jax.attention.block_plan import fully_visible, maybe_visible
from freeatten_jax.attention.variants import Mask


class Plan(NamedTuple):
    """Query-major kernels (forward, dq) read *_col of the queries and *_row of the keys; the key-major
    dkv kernel the opposite. Rows are stored per block ([.., blocks, 1, size]) so a kernel reads one."""

    q_col: jax.Array  # [2, B, Tp, 1] int32: query positions, segment ids
    q_row: jax.Array  # [2, B, I, 1, Q] the same, one row per query block
    kv_row: jax.Array  # [3, B, J, 1, C] int32: key positions, segment ids, valid (0/1)
    kv_col: jax.Array  # [3, B, Sp, 1] the same as columns
    n_col: jax.Array  # [B, Tp, 1] float32 N_i (0 on padded rows)
    n_row: jax.Array  # [B, I, 1, Q] the same as rows
    k_first: jax.Array  # [B, I] first and one-past-last key block that query block i may see
    k_end: jax.Array
    q_first: jax.Array  # [B, J] first and one-past-last query block that may see key block j
    q_end: jax.Array
    k_full: jax.Array  # [2, B, I] a run of key blocks inside [k_first, k_end) wholly visible to query block i
    q_full: jax.Array  # [2, B, J] a run of query blocks inside [q_first, q_end) that wholly see key block j


def _pad(x_BL, size: int, fill):
    """Pad [B, L] to a multiple of `size` with `fill` (None: repeat the last entry, widening no range)."""
    pad = -x_BL.shape[1] % size
    return jnp.pad(x_BL, ((0, 0), (0, pad)), **(dict(mode="edge") if fill is None else dict(constant_values=fill)))


def _run(full_BXY, end_BX):
    """The first run of True along Y for each (B, X) as [2, B, X]; (end, end) where there is none, so that
    the masked sweep before it covers the whole visiting span."""
    size = full_BXY.shape[2]
    anything = jnp.any(full_BXY, axis=2)
    start = jnp.argmax(full_BXY, axis=2)
    after = (jnp.arange(size) >= start[..., None]) & ~full_BXY
    stop = jnp.where(jnp.any(after, axis=2), jnp.argmax(after, axis=2), size)
    return jnp.stack([jnp.where(anything, start, end_BX), jnp.where(anything, stop, end_BX)]).astype(jnp.int32)


def _span(maybe_BXY):
    """First and one-past-last True along Y for each (B, X); (0, 0) where none."""
    size = maybe_BXY.shape[2]
    first = jnp.argmax(maybe_BXY, axis=2)
    end = size - jnp.argmax(maybe_BXY[:, :, ::-1], axis=2)
    anything = jnp.any(maybe_BXY, axis=2)
    return jnp.where(anything, first, 0).astype(jnp.int32), jnp.where(anything, end, 0).astype(jnp.int32)


def plan(mask: Mask, n_BT, block_q: int, block_k: int) -> Plan:
    """The mask arrays padded to whole blocks and laid out for the kernels, and the visiting spans."""
    b = n_BT.shape[0]
    qpos_BT, qseg_BT = _pad(mask.q_positions, block_q, None), _pad(mask.q_segment_ids, block_q, None)
    kpos_BS, kseg_BS = _pad(mask.kv_positions, block_k, None), _pad(mask.kv_segment_ids, block_k, None)
    kvalid_BS = _pad(mask.kv_valid, block_k, False)
    blocks_q = lambda x: x.reshape(b, -1, block_q)  # noqa: E731
    blocks_k = lambda x: x.reshape(b, -1, block_k)  # noqa: E731
    blocked = (blocks_q(qpos_BT), blocks_q(qseg_BT), blocks_k(kpos_BS), blocks_k(kseg_BS), blocks_k(kvalid_BS))
    maybe_BIJ, full_BIJ = maybe_visible(mask, *blocked), fully_visible(mask, *blocked)
    (k_first, k_end), (q_first, q_end) = _span(maybe_BIJ), _span(maybe_BIJ.transpose(0, 2, 1))
    q_2BT = jnp.stack([qpos_BT, qseg_BT])
    kv_3BS = jnp.stack([kpos_BS, kseg_BS, kvalid_BS.astype(jnp.int32)])
    return Plan(
        q_2BT[..., None],
        q_2BT.reshape(2, b, -1, 1, block_q),
        kv_3BS.reshape(3, b, -1, 1, block_k),
        kv_3BS[..., None],
        _pad(n_BT.astype(jnp.float32), block_q, 0.0)[..., None],
        _pad(n_BT.astype(jnp.float32), block_q, 0.0).reshape(b, -1, 1, block_q),
        k_first,
        k_end,
        q_first,
        q_end,
        _run(full_BIJ, k_end),
        _run(full_BIJ.transpose(0, 2, 1), q_end),
    )
