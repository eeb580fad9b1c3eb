"""What each attention variant computes (SPEC §2), independent of how it is computed.

Glossary: B batch, T queries, S keys, H query heads, K key/value heads, G = H // K, D head dim.
A variant is `prepare` (cast to float32 and fold every per-row factor into q, so that the scores
are plain dot products q'_i·k'_j) followed by a row normalisation named by `normalise`; each
implementation supplies its own code for the four normalisations.
"""
import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

NEG_INF = -1e30  # finite "minus infinity" for masked logits: fully masked rows give zeros, never NaN


# ----------------------------------------------------------------------------- mask and N_i


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["q_positions", "kv_positions", "q_segment_ids", "kv_segment_ids", "kv_valid"],
    meta_fields=["causal", "window", "plain"],
)
@dataclasses.dataclass(frozen=True)
class Mask:
    """Who sees whom: M_ij = causal ∧ same segment ∧ key not padding ∧ inside the window."""

    q_positions: jax.Array  # [B, T] int32 absolute positions of the queries
    kv_positions: jax.Array  # [B, S] int32
    q_segment_ids: jax.Array  # [B, T] int32
    kv_segment_ids: jax.Array  # [B, S] int32
    kv_valid: jax.Array  # [B, S] bool, False for padding keys
    causal: bool = True
    window: int | None = None  # keys farther than window - 1 positions away are hidden
    plain: bool = False  # known when tracing: T == S, positions 0..T-1 on both sides, one segment, no padding

    def visible(self) -> jax.Array:
        """M as a [B, T, S] bool array (works on any slice of queries and keys)."""
        q_BT1, kv_B1S = self.q_positions[:, :, None], self.kv_positions[:, None, :]
        m_BTS = (self.q_segment_ids[:, :, None] == self.kv_segment_ids[:, None, :]) & self.kv_valid[:, None, :]
        if self.causal:
            m_BTS &= kv_B1S <= q_BT1
        if self.window is not None:
            m_BTS &= jnp.abs(q_BT1 - kv_B1S) < self.window
        return m_BTS


def log_count(n):
    """log N_i in float32, with N_i = 0 (a fully masked row) treated as 1."""
    return jnp.log(jnp.maximum(n, 1).astype(jnp.float32))


# ----------------------------------------------------------------------------- variants


class Variant(NamedTuple):
    """prepare(q_BTHD, k_BSKD, n_BT, opts) -> (q', k') in float32; weight(scores, n) -> weights."""

    prepare: Callable[..., tuple[jax.Array, jax.Array]]
    normalise: str  # "softmax" | "sum" (l1) | "none" | "reweight" (LSSAR on top of "sum")
    weight: Callable[[jax.Array, jax.Array], jax.Array] | None = None  # for sum / none / reweight
    defaults: dict[str, Any] = {}  # the options the variant accepts, with their defaults


def _per_head(x, num_heads: int):
    """A scalar or [H] option as a [1, 1, H, 1] float32 array."""
    return jnp.broadcast_to(jnp.asarray(x, jnp.float32), (num_heads,))[None, None, :, None]


def l2_normalise(x):
    return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), 1e-12))


def _prepare_dot(q_BTHD, k_BSKD, n_BT, opts):
    return q_BTHD.astype(jnp.float32) / math.sqrt(q_BTHD.shape[-1]), k_BSKD.astype(jnp.float32)


def _prepare_ssmax(q_BTHD, k_BSKD, n_BT, opts):
    """Scale each query row by (s_h log N_i + b_h): identical to scaling its logits."""
    num_heads = q_BTHD.shape[2]
    factor_BTH1 = _per_head(opts["s"], num_heads) * log_count(n_BT)[:, :, None, None]
    if opts["b"] is not None:
        factor_BTH1 = factor_BTH1 + _per_head(opts["b"], num_heads)
    q_BTHD, k_BSKD = _prepare_dot(q_BTHD, k_BSKD, n_BT, opts)
    return q_BTHD * factor_BTH1, k_BSKD


def _prepare_lssa(q_BTHD, k_BSKD, n_BT, opts):
    """Unit-norm q and k (no 1/sqrt(d)); the temperature log(d) log(N_i) is folded into q."""
    temperature_BT11 = math.log(q_BTHD.shape[-1]) * log_count(n_BT)[:, :, None, None]
    q_BTHD, k_BSKD = q_BTHD.astype(jnp.float32), k_BSKD.astype(jnp.float32)
    return l2_normalise(q_BTHD) * temperature_BT11, l2_normalise(k_BSKD)


def _softplus_weight(scores, n):
    """softplus(x) = max(x, 0) + log1p(exp(-|x|)): the same values, faster on CPU than jax.nn.softplus."""
    return jnp.maximum(scores, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(scores)))


def _sigmoid_weight(scores, n):
    return jax.nn.sigmoid(scores - log_count(n))


def _relu_weight(scores, n):
    return jax.nn.relu(scores) / jnp.maximum(n, 1).astype(jnp.float32)


VARIANTS: dict[str, Variant] = {
    "softmax": Variant(_prepare_dot, "softmax"),
    "ssmax": Variant(_prepare_ssmax, "softmax", defaults={"s": 1.0, "b": None}),
    "lssa": Variant(_prepare_lssa, "sum", _softplus_weight),
    "lssar": Variant(_prepare_lssa, "reweight", _softplus_weight, defaults={"p": 15.0}),
    "sigmoid": Variant(_prepare_dot, "none", _sigmoid_weight),
    "relu": Variant(_prepare_dot, "none", _relu_weight),
}


def get_variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise ValueError(f"unknown attention variant {name!r}; valid variants: {', '.join(VARIANTS)}")
    return VARIANTS[name]


def variant_options(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """The variant's options with defaults filled in; unknown options raise ValueError."""
    defaults = get_variant(name).defaults
    unknown = set(given) - set(defaults)
    if unknown:
        allowed = ", ".join(defaults) or "none"
        raise ValueError(f"variant {name!r} got unknown option(s) {sorted(unknown)}; it accepts: {allowed}")
    return {**defaults, **given}


def reweight_offset(n):
    """LSSAR's o_i: 0 where N_i <= 3, else 1."""
    return jnp.where(n > 3, 1.0, 0.0).astype(jnp.float32)
