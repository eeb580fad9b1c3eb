"""`check_finite=True`: the opt-in check that `attend`'s inputs lie where its output is guaranteed finite (docs/method.md
§8), made on concrete arrays before anything is computed; one ValueError names the input at fault.

The range: every score stays below SCORE_LIMIT in magnitude (finite in float32 in any summation order, and above the
masked logits' NEG_INF), bounded by |q_i|·|k_j| with and without the score's factors (Cauchy-Schwarz); the variants
that L2-normalise q and k need their squared norms finite in float32; an un-normalised variant's output, at most
S · weight(largest score) · max |v_j|, must fit float32 and the output's dtype.
Traced inputs are refused, not passed: a compiled program can report only through a callback, whose error comes back
later as a runtime error among others; a check that could not raise would be a silent no-op.

Glossary: B batch, T queries, S keys, H query heads, K key/value heads, D head dim.
"""

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from freeatten_jax.attention import block_plan
from freeatten_jax.attention.variants import NEG_INF, Mask, Variant, is_concrete

FLOAT32_MAX = float(jnp.finfo(jnp.float32).max)
SCORE_LIMIT = -NEG_INF / 10  # 1e29: a tenth of the masked logits' stand-in, so float32 rounding cannot cross it
NORM_LIMIT = math.sqrt(FLOAT32_MAX)  # 1.8e19: the largest |x| whose squared norm is finite in float32


def _traced(arrays: dict[str, Any]) -> str | None:
    """The name of the first argument whose value is traced (under jit, grad or vmap), if any."""
    return next((name for name, x in arrays.items() if any(not is_concrete(leaf) for leaf in jax.tree.leaves(x))), None)


def _check_finite_where(name: str, x, reaches_BLH, what: str) -> None:
    """ValueError naming the first NaN/Inf of x [B, L, heads, D] in a row where reaches_BLH is True."""
    bad = np.asarray(~jnp.isfinite(x) & reaches_BLH[..., None])
    if bad.any():
        index = [int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape)]
        raise ValueError(f"check_finite: {name} holds NaN or Inf at {index}, in {what}")


def _norms(x, reaches_BLH) -> np.ndarray:
    """|x| over the last axis as float64 [B, L, heads], computed in float32 without overflow; 0 where not reached."""
    x = x.astype(jnp.float32)
    top = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
    squares = jnp.sum(jnp.square(x / jnp.where(top > 0, top, 1.0)), axis=-1)
    norms = np.asarray(top[..., 0], np.float64) * np.sqrt(np.asarray(squares, np.float64))
    return np.where(np.asarray(reaches_BLH), norms, 0.0)


def _largest(norms: np.ndarray) -> tuple[float, list[int]]:
    index = np.unravel_index(int(np.argmax(norms)), norms.shape)
    return float(norms[index]), [int(i) for i in index]


def _per_query_head(k_BSK: np.ndarray, heads: int) -> np.ndarray:
    """The largest of each batch row's keys [B, S, K] for each query head: [B, H]."""
    return np.repeat(k_BSK.max(axis=1), heads // k_BSK.shape[2], axis=1)


def check(q, k, v, spec: Variant, mask: Mask, opts: dict[str, Any], variant: str) -> None:
    """Raises one ValueError naming the input when q, k, v (concrete) lie outside the range of finite outputs."""
    if name := _traced({"q": q, "k": k, "v": v, "the mask": mask, **opts}):
        raise ValueError(
            f"check_finite=True checks the values of q, k and v, but {name} is traced (under jit, grad or vmap): call "
            f"attend on concrete arrays to check them (under jit, jax's jax_debug_nans flag finds a NaN)"
        )
    (b, t, h, _), (s, kv_heads) = q.shape, k.shape[1:3]
    n_BHT, seen_BHS = block_plan.count_visible(mask, min(s, 512))
    sees_BTH = jnp.broadcast_to(n_BHT.transpose(0, 2, 1) > 0, (b, t, h))
    groups = kv_heads if seen_BHS.shape[1] > 1 else 1
    seen_BSK = jnp.broadcast_to(jnp.any(seen_BHS.reshape(b, groups, -1, s), axis=2).transpose(0, 2, 1), (b, s, kv_heads))
    _check_finite_where("q", q, sees_BTH, "a query that sees a key")
    _check_finite_where("k", k, seen_BSK, "a key that a query sees (docs/method.md §8)")
    _check_finite_where("v", v, seen_BSK, "a value that a query sees (docs/method.md §8)")
    q_norms, k_norms = _norms(q, sees_BTH), _norms(k, seen_BSK)
    (q_top, q_at), (k_top, k_at) = _largest(q_norms), _largest(k_norms)
    a_BTH1, b_BSK1 = spec.scales(q, k, n_BHT, opts)
    if b_BSK1 is not None and max(q_top, k_top) >= NORM_LIMIT:
        name, top, at = ("q", q_top, q_at) if q_top >= k_top else ("k", k_top, k_at)
        raise ValueError(
            f"check_finite: {name}'s squared norm overflows float32: |{name}| = {top:.3g} at {at} is not below "
            f"{NORM_LIMIT:.3g}, and variant {variant!r} L2-normalises {name} in float32 (docs/method.md §8); scale {name} down"
        )
    # the kernels form q·k and then apply the factors, the other paths fold them into q and k first: both must hold
    raw_BH = q_norms.max(axis=1) * _per_query_head(k_norms, h)
    scaled_q = (q_norms * np.abs(np.asarray(a_BTH1, np.float64))[..., 0]).max(axis=1)
    scaled_k = k_norms if b_BSK1 is None else k_norms * np.abs(np.asarray(b_BSK1, np.float64))[..., 0]
    score = float(np.maximum(raw_BH, scaled_q * _per_query_head(scaled_k, h)).max())
    if score >= SCORE_LIMIT:
        raise ValueError(
            f"check_finite: q and k overflow together: |q_i| up to {q_top:.3g} (at [b, t, h] = {q_at}) and |k_j| up to "
            f"{k_top:.3g} (at [b, s, kv head] = {k_at}) bound the scores q_i·k_j, with and without their factors (scale), "
            f"by {score:.3g}, not below {SCORE_LIMIT:.0e}, within which they stay finite in float32 and above the masked "
            f"logits (docs/method.md §8); scale q or k down"
        )
    if spec.normalise == "none" and spec.weight is not None:
        weight = float(spec.weight(jnp.float32(score), jnp.float32(s)))
        v_top = float(jnp.max(jnp.where(seen_BSK[..., None], jnp.abs(v.astype(jnp.float32)), 0.0)))
        limit = min(FLOAT32_MAX, float(jnp.finfo(q.dtype).max))
        ranges = "float32's" if q.dtype == jnp.float32 else f"{q.dtype}'s and float32's"
        if (out := s * weight * v_top) >= limit:
            raise ValueError(
                f"check_finite: v is too large for variant {variant!r}: its weights (up to {weight:.3g} each over {s} "
                f"keys) times |v_j| up to {v_top:.3g} bound the output by {out:.3g}, not below {limit:.3g} ({ranges} "
                f"range; docs/method.md §8); scale v or the scores down"
            )
