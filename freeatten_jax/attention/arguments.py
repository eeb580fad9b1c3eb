"""Parsing `attend`'s public arguments: shape checks, the Mask (`make_mask`), the variant options, the opt-in
`check_finite` (finite.py).

Glossary: B batch, T queries, S keys, H query heads, K key/value heads, D head dim.
Shared by every entry point (`attend`, `attention_weights`, `context_parallel_attend`).
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from freeatten_jax.attention import finite
from freeatten_jax.attention.variants import Mask, Variant, check_positive_int, get_variant, is_concrete, variant_options


def _batch_rows(x, batch: int, length: int, name: str, dtype) -> jax.Array:
    """Broadcast an optional [L] or [B, L] array to [B, L]; ids and positions must be integers (a float is not cast)."""
    kinds = (jnp.bool_, jnp.integer) if dtype is bool else (jnp.integer,)
    if not any(jnp.issubdtype(jnp.result_type(x), kind) for kind in kinds):
        raise ValueError(f"{name} must be {'boolean' if dtype is bool else 'integers'}, got {jnp.result_type(x)}")
    x = jnp.asarray(x, dtype)
    if x.ndim not in (1, 2) or x.shape[-1] != length:
        raise ValueError(f"{name} must have shape [{length}] or [batch, {length}], got {x.shape}")
    return jnp.broadcast_to(x, (batch, length))


def make_mask(
    batch: int,
    q_len: int,
    kv_len: int,
    *,
    causal: bool = True,
    q_positions=None,
    kv_positions=None,
    q_offset=None,
    q_segment_ids=None,
    kv_segment_ids=None,
    kv_mask=None,
    window: int | None = None,
    mask=None,
) -> Mask:
    """Builds the Mask; default query positions are aligned so the last query sees every key.

    mask: an explicit boolean [batch or 1, heads or 1, q_len, kv_len] mask, ANDed with the rest."""
    if q_positions is not None and q_offset is not None:
        raise ValueError("pass q_positions or q_offset, not both")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    _check_offset(q_offset, q_len, kv_len)
    check_positive_int("window", window)
    if mask is not None:
        mask = _dense_mask(mask, batch, q_len, kv_len)
    given = (q_positions, kv_positions, q_offset, q_segment_ids, kv_segment_ids, kv_mask, window, mask)
    plain = q_len == kv_len and all(x is None for x in given)
    if q_positions is None:
        offset_B = jnp.broadcast_to(jnp.asarray(kv_len - q_len if q_offset is None else q_offset, jnp.int32), (batch,))
        q_positions = offset_B[:, None] + jnp.arange(q_len, dtype=jnp.int32)
    if kv_positions is None:
        kv_positions = jnp.arange(kv_len, dtype=jnp.int32)
    if kv_segment_ids is None and q_segment_ids is not None:
        if q_len != kv_len:
            raise ValueError("kv_segment_ids is required when q_len != kv_len")
        kv_segment_ids = q_segment_ids
    if q_segment_ids is None and kv_segment_ids is not None:
        raise ValueError("q_segment_ids is required when kv_segment_ids is given")
    zeros_q, zeros_kv = jnp.zeros((q_len,), jnp.int32), jnp.zeros((kv_len,), jnp.int32)
    return Mask(
        q_positions=_batch_rows(q_positions, batch, q_len, "q_positions", jnp.int32),
        kv_positions=_batch_rows(kv_positions, batch, kv_len, "kv_positions", jnp.int32),
        q_segment_ids=_batch_rows(zeros_q if q_segment_ids is None else q_segment_ids, batch, q_len, "q_segment_ids", jnp.int32),
        kv_segment_ids=_batch_rows(
            zeros_kv if kv_segment_ids is None else kv_segment_ids, batch, kv_len, "kv_segment_ids", jnp.int32
        ),
        kv_valid=_batch_rows(jnp.ones((kv_len,), bool) if kv_mask is None else kv_mask, batch, kv_len, "kv_mask", bool),
        causal=causal,
        window=None if window is None else int(window),
        plain=plain,
        dense=mask,
    )


def _check_offset(q_offset, q_len: int, kv_len: int) -> None:
    """A known q_offset (scalar or per row) must put every query inside the cache: 0 <= offset <= kv_len - q_len."""
    if q_offset is None or not is_concrete(q_offset):
        return
    offsets = np.asarray(q_offset)
    if not np.issubdtype(offsets.dtype, np.integer):
        raise ValueError(f"q_offset must be an integer (or one per batch row), got {offsets.dtype}")
    if offsets.size and (offsets.min() < 0 or offsets.max() > kv_len - q_len):
        raise ValueError(
            f"q_offset must be in [0, kv_len - q_len] = [0, {kv_len - q_len}] (the queries inside the {kv_len}-key cache), "
            f"got {offsets.tolist()}"
        )


def _dense_mask(mask, batch: int, q_len: int, kv_len: int) -> jax.Array:
    """The explicit mask as a [batch or 1, heads or 1, q_len, kv_len] bool array."""
    if not jnp.issubdtype(jnp.result_type(mask), jnp.bool_):
        raise ValueError(f"mask must be boolean (True = visible), got {jnp.result_type(mask)}")
    shape = jnp.shape(mask)
    if len(shape) != 4 or shape[0] not in (1, batch) or shape[2:] != (q_len, kv_len):
        raise ValueError(f"mask must have shape [{batch} or 1, heads or 1, {q_len}, {kv_len}], got {shape}")
    return jnp.asarray(mask)


MASK_OPTIONS = ("q_positions", "kv_positions", "q_offset", "q_segment_ids", "kv_segment_ids", "kv_mask", "window", "mask")


def _check_shapes(q, k, v):
    """ValueError unless q, k, v are floating [B, T, H, D], [B, S, K, D] with K dividing H."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be [batch, len, heads, head_dim]; got {q.shape}, {k.shape}, {v.shape}")
    if not all(jnp.issubdtype(x.dtype, jnp.floating) for x in (q, k, v)):
        raise ValueError(f"q, k, v must be floating point, got {q.dtype}, {k.dtype}, {v.dtype}")
    if len({jax.dtypes.canonicalize_dtype(x.dtype) for x in (q, k, v)}) > 1:  # numpy's float64 is float32 without x64
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype} (cast them: nothing is promoted)")
    if q.shape[1] == 0 or k.shape[1] == 0:
        raise ValueError(f"q_len and kv_len must be > 0, got {q.shape[1]} and {k.shape[1]}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {k.shape} vs {v.shape}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {q.shape} and k {k.shape} must agree on batch and head_dim")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"num_heads {q.shape[2]} must be a multiple of num_kv_heads {k.shape[2]}")


def parse(q, k, v, variant: str, causal: bool, options: dict[str, Any]) -> tuple[Variant, Mask, dict, dict]:
    """(Variant, Mask, variant options, implementation options) from the public arguments; with check_finite=True,
    concrete q, k, v checked to lie where the output is finite (finite.check)."""
    _check_shapes(q, k, v)
    check_finite = options.pop("check_finite", False)
    if not isinstance(check_finite, (bool, np.bool_)):
        raise TypeError(f"check_finite must be True or False, got {check_finite!r}")
    spec = get_variant(variant)
    mask_args = {name: options.pop(name) for name in MASK_OPTIONS if name in options}
    mask = make_mask(q.shape[0], q.shape[1], k.shape[1], causal=causal, **mask_args)
    if mask.dense is not None and mask.dense.shape[1] not in (1, q.shape[2]):
        raise ValueError(f"mask's head axis must be 1 or num_heads={q.shape[2]}, got {mask.dense.shape}")
    variant_args = {name: options.pop(name) for name in (*spec.defaults, "scale") if name in options}
    opts = variant_options(variant, variant_args, q.shape[2])
    if check_finite:
        finite.check(q, k, v, spec, mask, opts, variant)
    return spec, mask, opts, options
