"""The four row normalisations (docs/method.md §3) as block rules for the blockwise implementation.

Glossary: B batch, K kv heads, G = H // K, Q query-block rows, C key-block columns, D head dim,
I query blocks. Short names are block arrays [B, K, G, Q, C] (s scores, vis mask, u weights, dp, ds),
row statistics [B, K, G, Q, 1] (z, l, m, d, e), accumulators [B, K, G, Q, D] (acc, y), n is
[B, 1, 1, Q, 1]; under `sweep` every row array gains a leading I.

A rule's `forward(sweep, cfg)` streams key blocks with `sweep` and returns the output and its per-row
statistics; `backward_rows` turns those into the row terms of the gradient; `grad_block(s, vis, n,
rows, dp, cfg)` gives, for one block, the weights w (for dV) and the score gradient ds (for dQ, dK)
from the block's scores s and dp = dO·Vᵀ; LSSAR's `power_grad_block` (same arguments) gives each
score's share of dL/dp (a learnable p; None for the other rules, which have no p).
"""
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from freeatten_jax.attention.variants import NEG_INF, reweight_offset

_HIGHEST = jax.lax.Precision.HIGHEST
TINY = float(jnp.finfo(jnp.float32).tiny)


class Config(NamedTuple):
    """What a rule needs besides the blocks: the variant's weight, and LSSAR's p."""

    weight: Callable | None  # weight(scores, n), elementwise
    p: Any  # float32 scalar array (LSSAR's power)
    static_power: int | None  # p as an int when known at trace time, for an exact integer power
    p_grad: bool = False  # p is an array that may be differentiated (a Python number is not)


class Rule(NamedTuple):
    forward: Callable
    backward_rows: Callable
    grad_block: Callable
    power_grad_block: Callable | None = None


def pv(w_BKGQC, v_BKCD):
    return jnp.einsum("BKGQC,BKCD->BKGQD", w_BKGQC, v_BKCD, precision=_HIGHEST)


def _row_sum(x_BKGQC):
    return jnp.sum(x_BKGQC, axis=-1, keepdims=True)


def _weight_and_slope(cfg: Config, s, n):
    """The elementwise weight and its derivative in the score."""
    return jax.jvp(lambda x: cfg.weight(x, n), (s,), (jnp.ones_like(s),))


def _dot_rows(dout, out):
    return jnp.sum(dout * out, axis=-1, keepdims=True)


# ----------------------------------------------------------------------------- softmax (softmax, ssmax)


def _softmax_forward(sweep, cfg):
    """Online softmax: running max m, running sum l, rescaled accumulator."""

    def init(row0, acc0, rows):
        return row0 + NEG_INF, row0, acc0

    def step(carry, s, vis, v, n, rows):
        m, l, acc = carry
        s = jnp.where(vis, s, NEG_INF)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
        p = jnp.exp(s - m_new)
        scale = jnp.exp(m - m_new)
        return m_new, l * scale + _row_sum(p), acc * scale + pv(p, v)

    def finish(carry, n):
        m, l, acc = carry
        l = jnp.maximum(l, TINY)
        return jnp.where(n > 0, acc / l, 0.0), {"lse": m + jnp.log(l)}

    return sweep(init, step, finish)


def _softmax_backward_rows(rows, out, dout, cfg):
    return {"lse": rows["lse"], "d": _dot_rows(dout, out)}


def _softmax_grad_block(s, vis, n, rows, dp, cfg):
    w = jnp.where(vis, jnp.exp(s - rows["lse"]), 0.0)
    return w, w * (dp - rows["d"])


# ----------------------------------------------------------------------------- sum (lssa)


def _sum_forward(sweep, cfg):
    """One pass: Σ_j u_ij v_j and Z_i = Σ_j u_ij (u >= 0, so no running max)."""

    def init(row0, acc0, rows):
        return row0, acc0

    def step(carry, s, vis, v, n, rows):
        z, acc = carry
        u = jnp.where(vis, cfg.weight(s, n), 0.0)
        return z + _row_sum(u), acc + pv(u, v)

    def finish(carry, n):
        z, acc = carry
        z = jnp.maximum(z, TINY)
        return acc / z, {"z": z}

    return sweep(init, step, finish)


def _sum_backward_rows(rows, out, dout, cfg):
    return {"z": rows["z"], "d": _dot_rows(dout, out)}


def _sum_grad_block(s, vis, n, rows, dp, cfg):
    u, slope = _weight_and_slope(cfg, s, n)
    w = jnp.where(vis, u, 0.0) / rows["z"]
    return w, jnp.where(vis, (dp - rows["d"]) * slope, 0.0) / rows["z"]


# ----------------------------------------------------------------------------- none (sigmoid, relu)


def _none_forward(sweep, cfg):
    """One pass of Σ_j w_ij v_j; no row statistics."""

    def init(row0, acc0, rows):
        return acc0

    def step(acc, s, vis, v, n, rows):
        return acc + pv(jnp.where(vis, cfg.weight(s, n), 0.0), v)

    return sweep(init, step, lambda acc, n: (acc, {}))


def _none_backward_rows(rows, out, dout, cfg):
    return {}


def _none_grad_block(s, vis, n, rows, dp, cfg):
    w, slope = _weight_and_slope(cfg, s, n)
    return jnp.where(vis, w, 0.0), jnp.where(vis, dp * slope, 0.0)


# ----------------------------------------------------------------------------- reweight (lssar)
# Pass 1 gives Z_i and the row's largest u, hence the largest x_ij = N_i u_ij / Z_i - o_i (rounding
# is monotone, so x(max u) is max x). Pass 2 then needs no running max: r_ij = (x_ij / x_max)^p <= 1.
# A row with nothing above uniform (x_max <= 0) keeps its LSSA weights, as r_ij = u_ij / u_max.
# Pass 2 also accumulates Σ_j (r_ij / x_ij) v_j, which makes the backward pass single-sweep.


def _power(y, cfg: Config):
    if cfg.static_power is not None:
        return jax.lax.integer_pow(y, cfg.static_power)
    return jnp.exp(cfg.p * jnp.log(y))


def _reweight_terms(s, vis, n, rows, cfg, u):
    """x_ij, whether it counts (x > 0 on a re-weighted row), and r_ij before the row normalisation."""
    x = n * (u / rows["z"]) - reweight_offset(n)
    active = vis & (x > 0)
    r_sharp = _power(jnp.where(active, x, 0.0) / jnp.maximum(rows["x_max"], TINY), cfg)
    r = jnp.where(rows["sharp"], jnp.where(active, r_sharp, 0.0), u / jnp.maximum(rows["u_max"], TINY))
    return x, active, r


def _reweight_forward(sweep, cfg):
    def init1(row0, acc0, rows):
        return row0, row0

    def step1(carry, s, vis, v, n, rows):
        z, u_max = carry
        u = jnp.where(vis, cfg.weight(s, n), 0.0)
        return z + _row_sum(u), jnp.maximum(u_max, jnp.max(u, axis=-1, keepdims=True))

    def finish1(carry, n):
        z, u_max = carry
        z = jnp.maximum(z, TINY)
        x_max = n * (u_max / z) - reweight_offset(n)
        return None, {"z": z, "u_max": u_max, "x_max": x_max, "sharp": x_max > 0}

    _, rows = sweep(init1, step1, finish1)

    def init2(row0, acc0, rows):
        return row0, acc0, row0, acc0

    def step2(carry, s, vis, v, n, rows):
        l, acc, l_dx, acc_dx = carry
        x, active, r = _reweight_terms(s, vis, n, rows, cfg, jnp.where(vis, cfg.weight(s, n), 0.0))
        r_dx = jnp.where(active, r / jnp.where(active, x, 1.0), 0.0)
        return l + _row_sum(r), acc + pv(r, v), l_dx + _row_sum(r_dx), acc_dx + pv(r_dx, v)

    def finish2(carry, n):
        l, acc, l_dx, acc_dx = carry
        l = jnp.maximum(l, TINY)
        return acc / l, {"l": l, "y": acc_dx / l, "c": l_dx / l}

    out, rows2 = sweep(init2, step2, finish2, rows)
    return out, {**rows, **rows2}


def _reweight_backward_rows(rows, out, dout, cfg):
    """E_i = Σ_j da_ij a_ij, which for a re-weighted row is p o_i (dO_i·y_i - D_i c_i)."""
    d = _dot_rows(dout, out)
    e = cfg.p * (_dot_rows(dout, rows["y"]) - d * rows["c"])
    keep = ("z", "u_max", "x_max", "sharp", "l")
    return {**{name: rows[name] for name in keep}, "d": d, "e": jnp.where(rows["sharp"], e, 0.0)}


def _reweight_grad_block(s, vis, n, rows, dp, cfg):
    u, slope = _weight_and_slope(cfg, s, n)
    u = jnp.where(vis, u, 0.0)
    x, active, r = _reweight_terms(s, vis, n, rows, cfg, u)
    w = r / rows["l"]
    coef = jnp.where(rows["sharp"], jnp.where(active, n * cfg.p * w / jnp.where(active, x, 1.0), 0.0), 1.0)
    e = rows["e"] * reweight_offset(n)
    ds = jnp.where(vis, ((dp - rows["d"]) * coef - e) * slope, 0.0) / rows["z"]
    return w, ds


def _reweight_power_grad_block(s, vis, n, rows, dp, cfg):
    """dL/dp per score: A_ij = x_ij^p / Σ_k x_ik^p gives dA_ij/dp = A_ij (log x_ij - Σ_k A_ik log x_ik), so
    dL/dp = Σ_ij A_ij log x_ij (dp_ij - D_i) on re-weighted rows (the others do not use p). A row constant
    added to log x cancels, as Σ_j A_ij (dp_ij - D_i) = 0: log x, not log(x / x_max), is enough."""
    u = jnp.where(vis, cfg.weight(s, n), 0.0)
    x, active, r = _reweight_terms(s, vis, n, rows, cfg, u)
    return jnp.where(rows["sharp"] & active, r / rows["l"] * jnp.log(jnp.where(active, x, 1.0)) * (dp - rows["d"]), 0.0)


RULES = {
    "softmax": Rule(_softmax_forward, _softmax_backward_rows, _softmax_grad_block),
    "sum": Rule(_sum_forward, _sum_backward_rows, _sum_grad_block),
    "none": Rule(_none_forward, _none_backward_rows, _none_grad_block),
    "reweight": Rule(_reweight_forward, _reweight_backward_rows, _reweight_grad_block, _reweight_power_grad_block),
}
