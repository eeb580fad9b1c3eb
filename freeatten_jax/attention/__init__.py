"""Length-extrapolating attention as pure functions: `attend` and `attention_weights` (SPEC §4).

Glossary: B batch, T queries, S keys, H query heads, K key/value heads, D head dim.
`variant` names what is computed (VARIANTS); `implementation` names how (IMPLEMENTATIONS).
"""
from typing import Any

import jax
import jax.numpy as jnp

from freeatten_jax.attention import auto, blockwise, pallas, reference
from freeatten_jax.attention.variants import VARIANTS, Mask, Variant, get_variant, variant_options

IMPLEMENTATIONS = {
    "reference": reference.attend,
    "blockwise": blockwise.attend,
    "pallas": pallas.attend,
    "auto": auto.attend,
}

__all__ = ["attend", "attention_weights", "make_mask", "Mask", "Variant", "VARIANTS", "IMPLEMENTATIONS"]


def _batch_rows(x, batch: int, length: int, name: str, dtype) -> jax.Array:
    """Broadcast an optional [L] or [B, L] array to [B, L]."""
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
) -> Mask:
    """Builds the Mask; default query positions are aligned so the last query sees every key."""
    if q_positions is not None and q_offset is not None:
        raise ValueError("pass q_positions or q_offset, not both")
    given = (q_positions, kv_positions, q_offset, q_segment_ids, kv_segment_ids, kv_mask, window)
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
        kv_segment_ids=_batch_rows(zeros_kv if kv_segment_ids is None else kv_segment_ids, batch, kv_len, "kv_segment_ids", jnp.int32),
        kv_valid=_batch_rows(jnp.ones((kv_len,), bool) if kv_mask is None else kv_mask, batch, kv_len, "kv_mask", bool),
        causal=causal,
        window=window,
        plain=plain,
    )


_MASK_OPTIONS = ("q_positions", "kv_positions", "q_offset", "q_segment_ids", "kv_segment_ids", "kv_mask", "window")


def _check_shapes(q, k, v):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be [batch, len, heads, head_dim]; got {q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {k.shape} vs {v.shape}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {q.shape} and k {k.shape} must agree on batch and head_dim")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"num_heads {q.shape[2]} must be a multiple of num_kv_heads {k.shape[2]}")


def _split(q, k, v, variant: str, causal: bool, options: dict[str, Any]):
    """(Variant, Mask, variant options, implementation options) from the public arguments."""
    _check_shapes(q, k, v)
    spec = get_variant(variant)
    mask_args = {name: options.pop(name) for name in _MASK_OPTIONS if name in options}
    mask = make_mask(q.shape[0], q.shape[1], k.shape[1], causal=causal, **mask_args)
    variant_args = {name: options.pop(name) for name in spec.defaults if name in options}
    return spec, mask, variant_options(variant, variant_args), options


def attend(q, k, v, *, variant: str, causal: bool = True, implementation: str = "auto", **options) -> jax.Array:
    """Attention output [B, T, H, D] in q's dtype (normalisation in float32).

    options: the variant's own (`s`, `b` for ssmax; `p` for lssar, None = off), the mask's
    (`q_positions`, `kv_positions`, `q_offset`, `q_segment_ids`, `kv_segment_ids`, `kv_mask`,
    `window`), and any the implementation takes.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"unknown implementation {implementation!r}; valid: {', '.join(IMPLEMENTATIONS)}")
    spec, mask, opts, impl_options = _split(q, k, v, variant, causal, dict(options))
    if impl_options and implementation == "reference":
        raise ValueError(f"unknown option(s) {sorted(impl_options)} for variant {variant!r}")
    return IMPLEMENTATIONS[implementation](q, k, v, variant=spec, mask=mask, opts=opts, **impl_options)


def attention_weights(q, k, v, *, variant: str, causal: bool = True, **options) -> jax.Array:
    """The full weight matrix A as [B, H, T, S] float32 (reference path; for analysis and tests)."""
    spec, mask, opts, rest = _split(q, k, v, variant, causal, dict(options))
    rest.pop("implementation", None)
    if rest:
        raise ValueError(f"unknown option(s) {sorted(rest)} for variant {variant!r}")
    return reference.weights(q, k, variant=spec, mask=mask, opts=opts)
