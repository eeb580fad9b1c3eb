"""The four row normalisations (docs/method.md §3) written once: blockwise, the ring and the Pallas kernels use these.

Glossary: s scores, vis mask (None: every pair visible, the kernels' interior blocks), u / r / w weights,
dp = dO·Vᵀ, ds the score gradient: block arrays whose last axis is the key (rows reduce over it); row
statistics broadcast against them ([.., Q, 1]; key-major [1, Q] in the dK/dV kernels, where only the
elementwise `grad` runs); acc [.., Q, D]. A Family is its forward passes (each a fold over the visible key
blocks: init, step, finish), the row terms of its gradient and the elementwise gradient of one block.
"""

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from freeatten_jax.attention.variants import NEG_INF, reweight_offset

TINY = float(jnp.finfo(jnp.float32).tiny)
LOG2E = 1.4426950408889634


class Ctx(NamedTuple):
    """What a family sees of the current query block besides its scores."""

    n: Any  # N_i, float32, broadcasting against the block's rows
    p: Any  # float32 scalar, LSSAR's power
    static_power: int | None  # p when a known whole number (an exact integer power)
    weight: Callable | None  # the variant's elementwise weight(s, n), for the "none" family
    pv: Callable  # pv(w, v) = Σ_j w_ij v_j in float32, in the caller's layout


class Pass(NamedTuple):
    """One fold over the visible key blocks: step(carry, s, vis, v, ctx, rows); finish(carry, ctx) gives the
    output (None before the last pass) and the row statistics it adds to `rows`."""

    init: Callable  # init(row0 [.., Q, 1], acc0 [.., Q, D]) -> carry
    step: Callable
    finish: Callable
    with_values: bool = True  # the step reads v


class Family(NamedTuple):
    """`stats` / `extras` name the [Q, 1] / [Q, D] statistics the forward saves, `rows` what grad reads
    (backward_rows' keys); power_grad (LSSAR only; grad's arguments) is each score's share of dL/dp."""

    passes: tuple[Pass, ...]
    backward_rows: Callable  # (stats, out, dout, p) -> rows
    grad: Callable  # (s, vis, ctx, rows, dp) -> (w for dV, ds for dQ and dK)
    stats: tuple[str, ...]
    extras: tuple[str, ...]
    rows: tuple[str, ...]
    power_grad: Callable | None = None


def forward(family: Family, sweep: Callable, ctx: Ctx):
    """(out, statistics), each pass folded by `sweep(init, step(carry, s, vis, v), with_values)`."""
    out, rows = None, {}
    for one in family.passes:
        step = lambda carry, s, vis, v, one=one, rows=rows: one.step(carry, s, vis, v, ctx, rows)  # noqa: E731
        out, new = one.finish(sweep(one.init, step, one.with_values), ctx)
        rows = {**rows, **new}
    return out, rows


def softplus_and_sigmoid(s):
    """softplus(s) and sigmoid(s) sharing one exp2 of -|s|. log1p(t) for t = e^-|s| in (0, 1] is a
    3-term series below 2^-6 (relative error < 1e-6) and log(1 + t) above (error < 4e-6 relative):
    no log1p primitive, which not every Pallas backend lowers, and accurate down to e^-87."""
    t = jnp.exp2(-jnp.abs(s) * LOG2E)
    log1p_t = jnp.where(t < 2.0**-6, t * (1.0 - t * (0.5 - t * (1.0 / 3.0))), jnp.log(1.0 + t))
    return jnp.maximum(s, 0.0) + log1p_t, jnp.where(s >= 0, 1.0, t) / (1.0 + t)


def power(y, ctx: Ctx):
    """y ** p: an exact integer power when p is a known whole number."""
    return jax.lax.integer_pow(y, ctx.static_power) if ctx.static_power is not None else jnp.exp(ctx.p * jnp.log(y))


def _keep(vis, x, fill):
    """x where visible, else fill; an interior block (vis None: every pair visible) takes x as it is."""
    return x if vis is None else jnp.where(vis, x, fill)


def _row_sum(x):
    return jnp.sum(x, axis=-1, keepdims=True)


def _row_max(x):
    return jnp.max(x, axis=-1, keepdims=True)


def dot_rows(x, y):
    """Σ_d x_id y_id in float32, as [.., Q, 1]."""
    return _row_sum(x.astype(jnp.float32) * y.astype(jnp.float32))


def _zeros_and_accumulator(row0, acc0):
    return row0, acc0


# ----------------------------------------------------------------------------- softmax (softmax, ssmax)


def _softmax_step(carry, s, vis, v, ctx, rows):
    """Online softmax: running max m, running sum l, rescaled accumulator."""
    m, l, acc = carry
    s = _keep(vis, s, NEG_INF)
    m_new = jnp.maximum(m, _row_max(s))
    w = _keep(vis, jnp.exp2((s - m_new) * LOG2E), 0.0)
    scale = jnp.exp2((m - m_new) * LOG2E)
    return m_new, l * scale + _row_sum(w), acc * scale + ctx.pv(w, v)


def _softmax_finish(carry, ctx):
    m, l, acc = carry
    l = jnp.maximum(l, TINY)
    return jnp.where(ctx.n > 0, acc / l, 0.0), {"lse": m + jnp.log(l)}


def _softmax_grad(s, vis, ctx, rows, dp):
    w = _keep(vis, jnp.exp2((s - rows["lse"]) * LOG2E), 0.0)
    return w, _keep(vis, w * (dp - rows["d"]), 0.0)


# ----------------------------------------------------------------------------- sum (lssa)


def _sum_step(carry, s, vis, v, ctx, rows):
    """u = softplus(s) >= 0 grows at most linearly in a bounded score: no running max, no rescale."""
    z, acc = carry
    u = _keep(vis, softplus_and_sigmoid(s)[0], 0.0)
    return z + _row_sum(u), acc + ctx.pv(u, v)


def _sum_finish(carry, ctx):
    z, acc = carry
    z = jnp.maximum(z, TINY)
    return acc / z, {"z": z}


def _sum_grad(s, vis, ctx, rows, dp):
    u, slope = softplus_and_sigmoid(s)
    inv_z = 1.0 / rows["z"]  # one division per row, a multiply per score
    return _keep(vis, u * inv_z, 0.0), _keep(vis, (dp - rows["d"]) * (slope * inv_z), 0.0)


# ----------------------------------------------------------------------------- none (sigmoid, relu)


def _none_step(acc, s, vis, v, ctx, rows):
    return acc + ctx.pv(_keep(vis, ctx.weight(s, ctx.n), 0.0), v)


def _none_grad(s, vis, ctx, rows, dp):
    w, slope = jax.jvp(lambda x: ctx.weight(x, ctx.n), (s,), (jnp.ones_like(s),))
    return _keep(vis, w, 0.0), _keep(vis, dp * slope, 0.0)


# ----------------------------------------------------------------------------- reweight (lssar)
# Pass 1: Z_i and the largest u, hence the largest x_ij = N_i u_ij / Z_i - o_i (rounding is monotone, so
# x(max u) is max x). Pass 2 needs no running max: r_ij = (x_ij / x_max)^p <= 1; a row with nothing above
# uniform (x_max <= 0) keeps its LSSA weights (r = u / u_max). Pass 2 also accumulates
# y = Σ_j (r_ij / x_ij) v_j / l and c, which make the backward a single sweep (E_i = p (dO_i·y_i - D_i c_i)).


def _reweight_terms(s, vis, ctx, rows):
    """sigmoid(s), x, whether x counts (x > 0 on a visible pair), whether the row is re-weighted, and r
    before the row normalisation."""
    softplus, slope = softplus_and_sigmoid(s)
    u = _keep(vis, softplus, 0.0)
    x = u * (ctx.n / rows["z"]) - reweight_offset(ctx.n)  # row factors: one division per row, not per score
    active = x > 0 if vis is None else vis & (x > 0)
    sharp = rows["x_max"] > 0
    r_sharp = power(jnp.where(active, x, 0.0) * (1.0 / jnp.maximum(rows["x_max"], TINY)), ctx)
    r = jnp.where(sharp, jnp.where(active, r_sharp, 0.0), u * (1.0 / jnp.maximum(rows["u_max"], TINY)))
    return slope, x, active, sharp, r


def _reweight_step1(carry, s, vis, v, ctx, rows):
    z, u_max = carry
    u = _keep(vis, softplus_and_sigmoid(s)[0], 0.0)
    return z + _row_sum(u), jnp.maximum(u_max, _row_max(u))


def _reweight_finish1(carry, ctx):
    z, u_max = carry
    z = jnp.maximum(z, TINY)
    return None, {"z": z, "u_max": u_max, "x_max": ctx.n * (u_max / z) - reweight_offset(ctx.n)}


def _reweight_step2(carry, s, vis, v, ctx, rows):
    l, acc, l_dx, acc_dx = carry
    _, x, active, _, r = _reweight_terms(s, vis, ctx, rows)
    r_dx = jnp.where(active, r / jnp.where(active, x, 1.0), 0.0)
    return l + _row_sum(r), acc + ctx.pv(r, v), l_dx + _row_sum(r_dx), acc_dx + ctx.pv(r_dx, v)


def _reweight_finish2(carry, ctx):
    l, acc, l_dx, acc_dx = carry
    l = jnp.maximum(l, TINY)
    return acc / l, {"l": l, "c": l_dx / l, "y": acc_dx / l}


def _reweight_backward_rows(stats, out, dout, p):
    """E_i = Σ_j da_ij a_ij, which for a re-weighted row is p o_i (dO_i·y_i - D_i c_i)."""
    d = dot_rows(dout, out)
    e = p * (dot_rows(dout, stats["y"]) - d * stats["c"])
    return {**{name: stats[name] for name in ("z", "u_max", "x_max", "l")}, "d": d, "e": jnp.where(stats["x_max"] > 0, e, 0.0)}


def _reweight_grad(s, vis, ctx, rows, dp):
    slope, x, active, sharp, r = _reweight_terms(s, vis, ctx, rows)
    w = r * (1.0 / rows["l"])
    coef = jnp.where(sharp, jnp.where(active, (ctx.n * ctx.p) * w / jnp.where(active, x, 1.0), 0.0), 1.0)
    e = rows["e"] * reweight_offset(ctx.n)
    return w, _keep(vis, ((dp - rows["d"]) * coef - e) * (slope * (1.0 / rows["z"])), 0.0)


def _reweight_power_grad(s, vis, ctx, rows, dp):
    """dL/dp per score: A_ij = x_ij^p / Σ_k x_ik^p gives dA_ij/dp = A_ij (log x_ij - Σ_k A_ik log x_ik), so
    dL/dp = Σ_ij A_ij log x_ij (dp_ij - D_i) on re-weighted rows (the others do not use p). A row constant
    added to log x cancels, as Σ_j A_ij (dp_ij - D_i) = 0: log x, not log(x / x_max), is enough."""
    _, x, active, sharp, r = _reweight_terms(s, vis, ctx, rows)
    return jnp.where(sharp & active, r / rows["l"] * jnp.log(jnp.where(active, x, 1.0)) * (dp - rows["d"]), 0.0)


def _rows_with_d(*names):
    """backward_rows keeping the named statistics and adding D_i = dO_i·O_i."""
    return lambda stats, out, dout, p: {**{name: stats[name] for name in names}, "d": dot_rows(dout, out)}


FAMILIES = {
    "softmax": Family(
        (Pass(lambda row0, acc0: (row0 + NEG_INF, row0, acc0), _softmax_step, _softmax_finish),),
        _rows_with_d("lse"),
        _softmax_grad,
        ("lse",),
        (),
        ("lse", "d"),
    ),
    "sum": Family((Pass(_zeros_and_accumulator, _sum_step, _sum_finish),), _rows_with_d("z"), _sum_grad, ("z",), (), ("z", "d")),
    "none": Family(
        (Pass(lambda row0, acc0: acc0, _none_step, lambda acc, ctx: (acc, {})),), lambda *_: {}, _none_grad, (), (), ()
    ),
    "reweight": Family(
        (
            Pass(lambda row0, acc0: (row0, row0), _reweight_step1, _reweight_finish1, with_values=False),
            Pass(lambda row0, acc0: (row0, acc0, row0, acc0), _reweight_step2, _reweight_finish2),
        ),
        _reweight_backward_rows,
        _reweight_grad,
        ("z", "u_max", "x_max", "l", "c"),
        ("y",),
        ("z", "u_max", "x_max", "l", "d", "e"),
        _reweight_power_grad,
    ),
}
