"""What each attention variant computes (docs/method.md §2), independent of how it is computed.

Glossary: B batch, T queries, S keys, H query heads, K key/value heads, G = H // K, D head dim.
A variant is `scales` (the float32 factors a_i, b_j of the scores a_i b_j q_i·k_j; `prepare` folds them into
q and k) followed by a row normalisation named by `normalise`; each implementation supplies its own code for
the four normalisations.
"""

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

NEG_INF = -1e30  # finite "minus infinity" for masked logits: fully masked rows give zeros, never NaN


# ----------------------------------------------------------------------------- mask and N_i


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["q_positions", "kv_positions", "q_segment_ids", "kv_segment_ids", "kv_valid", "dense"],
    meta_fields=["causal", "window", "plain"],
)
@dataclasses.dataclass(frozen=True)
class Mask:
    """Who sees whom: M_ij = causal ∧ same segment ∧ key not padding ∧ inside the window ∧ dense_ij.

    `dense is not None` says an explicit boolean mask was given (a kernel that reads only the
    structured fields must refuse such a mask)."""

    q_positions: jax.Array  # [B, T] int32 absolute positions of the queries
    kv_positions: jax.Array  # [B, S] int32
    q_segment_ids: jax.Array  # [B, T] int32
    kv_segment_ids: jax.Array  # [B, S] int32
    kv_valid: jax.Array  # [B, S] bool, False for padding keys
    dense: jax.Array | None = None  # [B or 1, H or 1, T, S] bool: an explicit mask, ANDed with the rest
    causal: bool = True
    window: int | None = None  # keys farther than window - 1 positions away are hidden
    plain: bool = False  # known when tracing: T == S, positions 0..T-1 on both sides, one segment, no padding or dense mask

    def visible(self) -> jax.Array:
        """M as a [B, H or 1, T, S] bool array (works on any slice of queries and keys); the head
        axis is H only for a per-head dense mask."""
        q_BT1, kv_B1S = self.q_positions[:, :, None], self.kv_positions[:, None, :]
        m_BTS = (self.q_segment_ids[:, :, None] == self.kv_segment_ids[:, None, :]) & self.kv_valid[:, None, :]
        if self.causal:
            m_BTS &= kv_B1S <= q_BT1
        if self.window is not None:
            m_BTS &= jnp.abs(q_BT1 - kv_B1S) < self.window
        return m_BTS[:, None] if self.dense is None else m_BTS[:, None] & self.dense


def hide_unseen(k_BSKD, v_BSKD, seen_BHS):
    """Zero (with `where`) the keys and values that no query of their batch row and kv-head group
    sees, before any arithmetic: NaN/Inf there (padding, unfilled cache slots) then reach no output
    and no gradient. A non-finite key that some query sees is input, and may spread through 0·NaN
    to the other rows of its batch row and group."""
    b, s, kv_heads, _ = k_BSKD.shape
    groups = kv_heads if seen_BHS.shape[1] > 1 else 1
    seen_BS11 = jnp.any(seen_BHS.reshape(b, groups, -1, s), axis=2).transpose(0, 2, 1)[..., None]
    return jnp.where(seen_BS11, k_BSKD, 0), jnp.where(seen_BS11, v_BSKD, 0)


def log_count(n):
    """log N_i in float32, with N_i = 0 (a fully masked row) treated as 1."""
    return jnp.log(jnp.maximum(n, 1).astype(jnp.float32))


# ----------------------------------------------------------------------------- variants


class Variant(NamedTuple):
    """scales(q_BTHD, k_BSKD, n_BHT, opts) -> (a_BTH1, b_BSK1 or None) in float32: the per-query and per-key
    factors of the scores, s_ij = a_i b_j q_i·k_j (n_BHT: N_i, H or 1 heads); weight(scores, n) -> weights.
    The kernels take q and k as given and these factors apart, so bfloat16 inputs are rounded only once."""

    scales: Callable[..., tuple[jax.Array, jax.Array | None]]
    normalise: str  # "softmax" | "sum" (l1) | "none" | "reweight" (LSSAR on top of "sum")
    # "none": each score's weight, in every implementation. "sum" / "reweight": softplus, which only the reference
    # reads (blockwise and the kernels compute it fused with its sigmoid, rules.softplus_and_sigmoid): a "sum"
    # variant of another weight needs its own family in rules.py.
    weight: Callable[[jax.Array, jax.Array], jax.Array] | None = None
    defaults: dict[str, Any] = {}  # the options the variant accepts, with their defaults

    def rule(self, opts) -> str:
        """The row rule a call runs: `normalise`, except LSSAR with p=None (re-weighting off), which is LSSA's sum."""
        return "sum" if self.normalise == "reweight" and opts.get("p") is None else self.normalise

    def prepare(self, q_BTHD, k_BSKD, n_BHT, opts):
        """(q', k') = (a q, b k) in float32: every factor folded in, so that the scores are plain q'_i·k'_j."""
        a_BTH1, b_BSK1 = self.scales(q_BTHD, k_BSKD, n_BHT, opts)
        k_BSKD = k_BSKD.astype(jnp.float32)
        return q_BTHD.astype(jnp.float32) * a_BTH1, k_BSKD if b_BSK1 is None else k_BSKD * b_BSK1


def _per_head(x, num_heads: int):
    """A scalar or [H] option as a [1, 1, H, 1] float32 array."""
    return jnp.broadcast_to(jnp.asarray(x, jnp.float32), (num_heads,))[None, None, :, None]


def inverse_norm(x):
    """1 / max(|x|, 1e-6) over the last axis, float32, as [.., 1]: a zero row stays zero."""
    x = x.astype(jnp.float32)
    return jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), 1e-12))


def _log_count_BTH1(n_BHT):
    return log_count(n_BHT).transpose(0, 2, 1)[..., None]


def _scales_dot(q_BTHD, k_BSKD, n_BHT, opts):
    """`scale` (default 1/sqrt(d)) for every query; no key factor."""
    b, t, h, d = q_BTHD.shape
    scale = 1.0 / math.sqrt(d) if opts.get("scale") is None else opts["scale"]
    return jnp.broadcast_to(jnp.asarray(scale, jnp.float32), (b, t, h, 1)), None


def _scales_ssmax(q_BTHD, k_BSKD, n_BHT, opts):
    """Each query row's scale times (s_h log N_i + b_h): identical to scaling its logits."""
    num_heads = q_BTHD.shape[2]
    factor_BTH1 = _per_head(opts["s"], num_heads) * _log_count_BTH1(n_BHT)
    if opts["b"] is not None:
        factor_BTH1 = factor_BTH1 + _per_head(opts["b"], num_heads)
    return _scales_dot(q_BTHD, k_BSKD, n_BHT, opts)[0] * factor_BTH1, None


def _scales_lssa(q_BTHD, k_BSKD, n_BHT, opts):
    """Unit-norm q and k (no 1/sqrt(d)), the temperature log(d) log(N_i) on the query side; with
    `temperature_length` L, log(d) log(L) for every row (the control that freezes the temperature where training
    left it; L may be traced, as options are when a caller jits them)."""
    length = opts.get("temperature_length")
    log_n_BTH1 = _log_count_BTH1(n_BHT) if length is None else jnp.log(jnp.full((1, 1, 1, 1), length, jnp.float32))
    temperature_BTH1 = math.log(q_BTHD.shape[-1]) * log_n_BTH1
    return inverse_norm(q_BTHD) * temperature_BTH1, inverse_norm(k_BSKD)


@jax.custom_jvp
def _softplus(x):
    """softplus(x) = max(x, 0) + log1p(exp(-|x|)): the same values, faster on CPU than jax.nn.softplus. Its
    derivative is sigmoid(x) by definition: autodiff of max and |x| gives 0 at x = 0, not 1/2 (a q = 0 row
    then had no gradient at all)."""
    return jnp.maximum(x, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(x)))


_softplus.defjvp(lambda primals, tangents: (_softplus(primals[0]), jax.nn.sigmoid(primals[0]) * tangents[0]))


def _softplus_weight(scores, n):
    return _softplus(scores)


def _sigmoid_weight(scores, n):
    return jax.nn.sigmoid(scores - log_count(n))


def _relu_weight(scores, n):
    return jax.nn.relu(scores) / jnp.maximum(n, 1).astype(jnp.float32)


# `scale` replaces 1/sqrt(d) wherever the formula has it (softmax, ssmax, sigmoid, relu); lssa and
# lssar L2-normalise q and k, so a scale would be meaningless there and is rejected.
VARIANTS: dict[str, Variant] = {
    "softmax": Variant(_scales_dot, "softmax", defaults={"scale": None}),
    "ssmax": Variant(_scales_ssmax, "softmax", defaults={"s": 1.0, "b": None, "scale": None}),
    "lssa": Variant(_scales_lssa, "sum", _softplus_weight, defaults={"temperature_length": None}),
    "lssar": Variant(_scales_lssa, "reweight", _softplus_weight, defaults={"p": 15.0, "temperature_length": None}),
    "sigmoid": Variant(_scales_dot, "none", _sigmoid_weight, defaults={"scale": None}),
    "relu": Variant(_scales_dot, "none", _relu_weight, defaults={"scale": None}),
}


def get_variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise ValueError(f"unknown attention variant {name!r}; valid variants: {', '.join(VARIANTS)}")
    return VARIANTS[name]


def check_positive_int(name: str, x) -> None:
    """Raises ValueError unless x is None or a Python/NumPy int > 0."""
    if x is not None and (isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x <= 0):
        raise ValueError(f"{name} must be a positive int (or None), got {x!r}")


def is_concrete(x) -> bool:
    """Whether x's value is known now (not a tracer under jit, grad or vmap)."""
    return not isinstance(x, jax.core.Tracer)


def _check_per_head(name: str, x, num_heads: int | None) -> None:
    """A scalar or [num_heads] option, finite where its value is known."""
    shape = jnp.shape(x)
    if shape not in ((), (1,)) and (len(shape) != 1 or num_heads not in (None, shape[0])):
        raise ValueError(f"{name} must be a scalar or have shape [{num_heads or 'num_heads'}], got shape {shape}")
    if is_concrete(x) and not np.all(np.isfinite(np.asarray(x, np.float64))):
        raise ValueError(f"{name} must be finite, got {x}")


def _check_positive(name: str, x, num_heads: int | None) -> None:
    """A scalar > 0 and finite where its value is known."""
    if jnp.shape(x) != ():
        raise ValueError(f"{name} must be a scalar, got shape {jnp.shape(x)}")
    if is_concrete(x) and not (np.isfinite(float(x)) and float(x) > 0):
        raise ValueError(f"{name} must be > 0 and finite, got {x}")


def _check_length(name: str, x, num_heads: int | None) -> None:
    """A number > 1 (a length whose log is a positive temperature), finite where its value is known."""
    _check_positive(name, x, num_heads)
    if is_concrete(x) and float(x) <= 1:
        raise ValueError(f"{name} must be > 1 (a sequence length), got {x}")


OPTION_CHECKS = {
    "s": _check_per_head,
    "b": _check_per_head,
    "p": _check_positive,
    "scale": _check_positive,
    "temperature_length": _check_length,
}


def variant_options(name: str, given: dict[str, Any], num_heads: int | None = None) -> dict[str, Any]:
    """The variant's options with defaults filled in and given values checked (ValueError naming the
    option: unknown, wrong shape for num_heads, non-finite, p or scale <= 0); None leaves one off."""
    defaults = get_variant(name).defaults
    unknown = set(given) - set(defaults)
    if "scale" in unknown:
        raise ValueError(f"variant {name!r} takes no scale: it L2-normalises q and k (its temperature is log(d) log(N_i))")
    if unknown:
        allowed = ", ".join(defaults) or "none"
        raise ValueError(f"variant {name!r} got unknown option(s) {sorted(unknown)}; it accepts: {allowed}")
    for option, value in given.items():
        if value is not None:
            OPTION_CHECKS[option](option, value, num_heads)
    return {**defaults, **given}


# LSSAR re-weights a row only where its largest x_ij = N_i A0_ij - o_i exceeds this (docs/method.md §2): a row
# closer to uniform is uniform up to float32 rounding (Z_i's own rounding error reaches ~1e-5 relative at long
# lengths), and re-weighting it would pick keys by rounding noise, with gradients of size 1 / x_max.
REWEIGHT_MARGIN = 2.0**-10


def reweight_offset(n):
    """LSSAR's o_i: 0 where N_i <= 3, else 1."""
    return jnp.where(n > 3, 1.0, 0.0).astype(jnp.float32)
