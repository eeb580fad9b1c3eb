"""Pallas kernel bodies for the four row normalisations (docs/method.md §3): forward, dQ and dK/dV kernels.

Glossary: Q / C query / key block length, D head dim, G = H // K query heads per kv head. In a kernel
every array is 2-D: scores s, mask vis, weights w, ds are [Q, C] (key-major [C, Q] in the dkv kernel,
where row statistics come as [1, Q] rows; the family maths is elementwise, so it serves both); row
statistics [Q, 1]; blocks of q, k, v, out [Q|C, D]. A `Family` holds one normalisation's math; the three kernels
(forward, dq, dkv) stream key (or query) blocks between the bounds that pallas_plan computed, so
provably invisible block pairs cost nothing, and the run of wholly visible (interior) blocks is swept
without any mask (`vis` None; issue 20: masking every block cost 3x the instructions of the softmax
forward on an H100). Masked scores use `where`, and key rows hidden from the
whole query block are zeroed before any matmul that contracts over keys (docs/method.md §8: NaN/Inf there
never reach a visible output or gradient).
"""
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from freeatten_jax.attention.variants import NEG_INF, reweight_offset

TINY = float(jnp.finfo(jnp.float32).tiny)
LOG2E = 1.4426950408889634
NT = (((1,), (1,)), ((), ()))  # a [M, D] x b [N, D] -> [M, N]
NN = (((1,), (0,)), ((), ()))  # a [M, N] x b [N, D] -> [M, D]


def dot(a, b, dims):
    """A float32-accumulated matmul; float32 operands at full precision, others on the tensor cores."""
    precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


# ----------------------------------------------------------------------------- elementwise maths


def softplus_and_sigmoid(s):
    """softplus(s) and sigmoid(s) sharing one exp2 of -|s|. log1p(t) for t = e^-|s| in (0, 1] is a
    3-term series below 2^-6 (relative error < 1e-6) and log(1 + t) above (error < 4e-6 relative):
    no log1p primitive, which not every Pallas backend lowers, and accurate down to e^-87."""
    t = jnp.exp2(-jnp.abs(s) * LOG2E)
    log1p_t = jnp.where(t < 2.0**-6, t * (1.0 - t * (0.5 - t * (1.0 / 3.0))), jnp.log(1.0 + t))
    return jnp.maximum(s, 0.0) + log1p_t, jnp.where(s >= 0, 1.0, t) / (1.0 + t)


def _power(y, p, static_power):
    return jax.lax.integer_pow(y, static_power) if static_power is not None else jnp.exp(p * jnp.log(y))


class Ctx(NamedTuple):
    """What a family sees of the current query block besides its scores."""

    n: jax.Array  # [Q, 1] float32 N_i
    p: jax.Array  # float32 scalar, LSSAR's power
    static_power: int | None  # p when a known whole number (an exact integer power)
    weight: Callable | None  # the variant's elementwise weight(s, n), for the "none" family


class Family(NamedTuple):
    """forward(sweep, ctx) -> (out [Q, D], row statistics); grad(s, vis, ctx, rows, dp) -> (w, ds), elementwise.

    `sweep(init, step)` folds step(carry, s, vis, v) over the visible key blocks. `stats` names the
    [Q, 1] statistics the forward saves, `extras` the [Q, D] ones; `rows` names what grad reads.
    power_grad (LSSAR only; grad's arguments): each score's share of dL/dp."""

    forward: Callable
    grad: Callable
    stats: tuple[str, ...]
    extras: tuple[str, ...]
    rows: tuple[str, ...]
    power_grad: Callable | None = None


def _keep(vis, x, fill):
    """x where visible, else fill; an interior block (vis None: every pair visible) takes x as it is."""
    return x if vis is None else jnp.where(vis, x, fill)


def _row_sum(x):
    return jnp.sum(x, axis=1, keepdims=True)


def _pv(w, v):
    return dot(w.astype(v.dtype), v, NN)


# ----------------------------------------------------------------------------- softmax (softmax, ssmax)


def _softmax_forward(sweep, ctx):
    def step(carry, s, vis, v):
        m, l, acc = carry
        s = _keep(vis, s, NEG_INF)
        m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        w = _keep(vis, jnp.exp2((s - m_new) * LOG2E), 0.0)
        scale = jnp.exp2((m - m_new) * LOG2E)
        return m_new, l * scale + _row_sum(w), acc * scale + _pv(w, v)

    m, l, acc = sweep(lambda row0, acc0: (row0 + NEG_INF, row0, acc0), step)
    l = jnp.maximum(l, TINY)
    return jnp.where(ctx.n > 0, acc / l, 0.0), {"lse": m + jnp.log(l)}


def _softmax_grad(s, vis, ctx, rows, dp):
    w = _keep(vis, jnp.exp2((s - rows["lse"]) * LOG2E), 0.0)
    return w, _keep(vis, w * (dp - rows["d"]), 0.0)


# ----------------------------------------------------------------------------- sum (lssa)


def _sum_forward(sweep, ctx):
    """u = softplus(s) >= 0 grows at most linearly in a bounded score: no running max, no rescale."""

    def step(carry, s, vis, v):
        z, acc = carry
        u = _keep(vis, softplus_and_sigmoid(s)[0], 0.0)
        return z + _row_sum(u), acc + _pv(u, v)

    z, acc = sweep(lambda row0, acc0: (row0, acc0), step)
    z = jnp.maximum(z, TINY)
    return acc / z, {"z": z}


def _sum_grad(s, vis, ctx, rows, dp):
    u, slope = softplus_and_sigmoid(s)
    return _keep(vis, u / rows["z"], 0.0), _keep(vis, (dp - rows["d"]) * slope / rows["z"], 0.0)


# ----------------------------------------------------------------------------- none (sigmoid, relu)


def _none_forward(sweep, ctx):
    def step(acc, s, vis, v):
        return acc + _pv(_keep(vis, ctx.weight(s, ctx.n), 0.0), v)

    return sweep(lambda row0, acc0: acc0, step), {}


def _none_grad(s, vis, ctx, rows, dp):
    w, slope = jax.jvp(lambda x: ctx.weight(x, ctx.n), (s,), (jnp.ones_like(s),))
    return _keep(vis, w, 0.0), _keep(vis, dp * slope, 0.0)


# ----------------------------------------------------------------------------- reweight (lssar)
# Pass 1: Z_i and the largest u, hence the largest x_ij = N_i u_ij / Z_i - o_i. Pass 2 needs no
# running max: r_ij = (x_ij / x_max)^p <= 1; a row with nothing above uniform (x_max <= 0) keeps its
# LSSA weights (r = u / u_max). Pass 2 also accumulates y = Σ_j (r_ij / x_ij) v_j / l and c, which
# make the backward a single sweep (E_i = p (dO_i·y_i - D_i c_i), formed outside the kernels).


def _reweight_terms(s, vis, ctx, rows):
    """u, sigmoid(s), x, whether x counts, and r before the row normalisation."""
    softplus, slope = softplus_and_sigmoid(s)
    u = _keep(vis, softplus, 0.0)
    x = ctx.n * (u / rows["z"]) - reweight_offset(ctx.n)
    active = x > 0 if vis is None else vis & (x > 0)
    sharp = rows["x_max"] > 0
    r_sharp = _power(jnp.where(active, x, 0.0) / jnp.maximum(rows["x_max"], TINY), ctx.p, ctx.static_power)
    r = jnp.where(sharp, jnp.where(active, r_sharp, 0.0), u / jnp.maximum(rows["u_max"], TINY))
    return slope, x, active, sharp, r


def _reweight_forward(sweep, ctx):
    def step1(carry, s, vis, v):
        z, u_max = carry
        u = _keep(vis, softplus_and_sigmoid(s)[0], 0.0)
        return z + _row_sum(u), jnp.maximum(u_max, jnp.max(u, axis=1, keepdims=True))

    z, u_max = sweep(lambda row0, acc0: (row0, row0), step1, with_values=False)
    z = jnp.maximum(z, TINY)
    rows = {"z": z, "u_max": u_max, "x_max": ctx.n * (u_max / z) - reweight_offset(ctx.n)}

    def step2(carry, s, vis, v):
        l, acc, l_dx, acc_dx = carry
        _, x, active, _, r = _reweight_terms(s, vis, ctx, rows)
        r_dx = jnp.where(active, r / jnp.where(active, x, 1.0), 0.0)
        return l + _row_sum(r), acc + _pv(r, v), l_dx + _row_sum(r_dx), acc_dx + _pv(r_dx, v)

    l, acc, l_dx, acc_dx = sweep(lambda row0, acc0: (row0, acc0, row0, acc0), step2)
    l = jnp.maximum(l, TINY)
    return acc / l, {**rows, "l": l, "c": l_dx / l, "y": acc_dx / l}


def _reweight_grad(s, vis, ctx, rows, dp):
    slope, x, active, sharp, r = _reweight_terms(s, vis, ctx, rows)
    w = r / rows["l"]
    coef = jnp.where(sharp, jnp.where(active, ctx.n * ctx.p * w / jnp.where(active, x, 1.0), 0.0), 1.0)
    e = rows["e"] * reweight_offset(ctx.n)
    return w, _keep(vis, ((dp - rows["d"]) * coef - e) * slope / rows["z"], 0.0)


def _reweight_power_grad(s, vis, ctx, rows, dp):
    """dL/dp = Σ_ij A_ij log x_ij (dp_ij - D_i) over re-weighted rows (as blockwise_rules)."""
    _, x, active, sharp, r = _reweight_terms(s, vis, ctx, rows)
    return jnp.where(sharp & active, r / rows["l"] * jnp.log(jnp.where(active, x, 1.0)) * (dp - rows["d"]), 0.0)


FAMILIES = {
    "softmax": Family(_softmax_forward, _softmax_grad, ("lse",), (), ("lse", "d")),
    "sum": Family(_sum_forward, _sum_grad, ("z",), (), ("z", "d")),
    "none": Family(_none_forward, _none_grad, (), (), ()),
    "reweight": Family(
        _reweight_forward, _reweight_grad, ("z", "u_max", "x_max", "l", "c"), ("y",), ("z", "u_max", "x_max", "l", "d", "e"),
        _reweight_power_grad,
    ),
}


# ----------------------------------------------------------------------------- masks inside a kernel


class Static(NamedTuple):
    """Trace-time constants of a kernel."""

    family: str
    causal: bool
    window: int | None
    block_q: int
    block_k: int
    kv_groups: int  # G
    static_power: int | None
    weight: Callable | None
    dtype: Any  # the inputs' dtype: the matmul operands and the output
    p_grad: bool  # the dq kernel also gives each row's share of dL/dp (LSSAR with an array p)


def visible(cfg: Static, q_pos, q_seg, k_pos, k_seg, k_valid):
    """M for a column of one side against a row of the other ([Q, C] or key-major [C, Q]): same
    segment, valid key, causal and window. Arguments are int32; k_valid is 0/1."""
    vis = (q_seg == k_seg) & (k_valid > 0)
    if cfg.causal:
        vis &= k_pos <= q_pos
    if cfg.window is not None:
        vis &= jnp.abs(q_pos - k_pos) < cfg.window
    return vis


def _rows(ref, lead, start, size):
    """ref[*lead, start:start + size, :] for a block-aligned dynamic start."""
    return ref[(*lead, pl.ds(pl.multiple_of(start, size), size), slice(None))]


def key_block(cfg: Static, key_rows, q_col):
    """The [Q, C] mask of a key block (its positions, segments, validity as [1, C] rows), and the [C, 1]
    keys that no query of the block sees (the row of per-key maxima turned into a column through an
    [8, C] transpose, which every backend lowers)."""
    vis = visible(cfg, *q_col, *key_rows)
    seen_1C = jnp.max(vis.astype(jnp.float32), axis=0, keepdims=True)
    seen_C1 = jnp.max(jnp.broadcast_to(seen_1C, (8, seen_1C.shape[1])).T, axis=1, keepdims=True)
    return vis, seen_C1 > 0


def _ctx(cfg: Static, n, p_ref):
    return Ctx(n=n, p=p_ref[0], static_power=cfg.static_power, weight=cfg.weight)


def sweep_spans(first, end, full, masked, interior, carry):
    """Folds `masked(j, carry)` over the key (or query) blocks of [first, full[0]) and [full[1], end), and
    `interior` over the run [full[0], full[1]) of wholly visible ones (pallas_plan), in order."""
    carry = jax.lax.fori_loop(first, full[0], masked, carry)
    carry = jax.lax.fori_loop(full[0], full[1], interior, carry)
    return jax.lax.fori_loop(full[1], end, masked, carry)


def forward_kernel(cfg: Static, first_ref, end_ref, full_ref, p_ref, q_ref, k_ref, v_ref, qcol_ref, kvrow_ref, n_ref, *out_refs):
    """One (batch, head, query block): out and the family's statistics, streaming visible key blocks."""
    b, i = pl.program_id(0), pl.program_id(2)
    family = FAMILIES[cfg.family]
    q = q_ref[...]
    q_col = (qcol_ref[0], qcol_ref[1])

    def sweep(init, step, with_values=True):
        def body(masked, j, carry):
            k = _rows(k_ref, (), j * cfg.block_k, cfg.block_k)
            v = _rows(v_ref, (), j * cfg.block_k, cfg.block_k) if with_values else None
            vis = None
            if masked:
                vis, seen = key_block(cfg, [kvrow_ref[x, j] for x in range(3)], q_col)
                k = jnp.where(seen, k, 0)
                v = jnp.where(seen, v, 0) if with_values else None
            return step(carry, dot(q, k, NT), vis, v)

        row0 = jnp.zeros((cfg.block_q, 1), jnp.float32)
        acc0 = jnp.zeros((cfg.block_q, q.shape[1]), jnp.float32)
        full = (full_ref[0, b, i], full_ref[1, b, i])
        return sweep_spans(first_ref[b, i], end_ref[b, i], full, functools.partial(body, True), functools.partial(body, False),
                           init(row0, acc0))

    out, stats = family.forward(sweep, _ctx(cfg, n_ref[...], p_ref))
    out_ref, *stat_refs = out_refs
    out_ref[...] = out.astype(out_ref.dtype)
    for ref, name in zip(stat_refs, family.stats + family.extras):
        ref[...] = stats[name]


def dq_kernel(cfg: Static, first_ref, end_ref, full_ref, p_ref, q_ref, k_ref, v_ref, qcol_ref, kvrow_ref, n_ref, dout_ref, *refs):
    """dq for one (batch, head, query block): Σ_j ds_ij k_j over the visible key blocks (and, if
    cfg.p_grad, the block's rows' shares of dL/dp as [Q, 1])."""
    b, i = pl.program_id(0), pl.program_id(2)
    family = FAMILIES[cfg.family]
    row_refs, out_refs = refs[: len(family.rows)], refs[len(family.rows) :]
    rows = {name: ref[...] for name, ref in zip(family.rows, row_refs)}
    q, dout, ctx = q_ref[...], dout_ref[...], _ctx(cfg, n_ref[...], p_ref)
    q_col = (qcol_ref[0], qcol_ref[1])

    def body(masked, j, carry):
        dq, dpow = carry
        k = _rows(k_ref, (), j * cfg.block_k, cfg.block_k)
        v = _rows(v_ref, (), j * cfg.block_k, cfg.block_k)  # only through dp, whose hidden entries `where` drops
        vis = None
        if masked:
            vis, seen = key_block(cfg, [kvrow_ref[x, j] for x in range(3)], q_col)
            k = jnp.where(seen, k, 0)
        args = (dot(q, k, NT), vis, ctx, rows, dot(dout, v, NT))
        _, ds = family.grad(*args)
        if cfg.p_grad:
            dpow = dpow + _row_sum(family.power_grad(*args))
        return dq + dot(ds.astype(k.dtype), k, NN), dpow

    carry = (jnp.zeros(q.shape, jnp.float32), jnp.zeros((cfg.block_q, 1), jnp.float32))
    full = (full_ref[0, b, i], full_ref[1, b, i])
    carry = sweep_spans(first_ref[b, i], end_ref[b, i], full, functools.partial(body, True), functools.partial(body, False), carry)
    for ref, x in zip(out_refs, carry):
        ref[...] = x


def dkv_kernel(cfg: Static, first_ref, end_ref, full_ref, p_ref, q_ref, k_ref, v_ref, qrow_ref, kvcol_ref, n_ref, dout_ref, *refs):
    """dk, dv for one (batch, kv head, key block): sums over the G query heads and visible query blocks.
    Key-major: blocks are [C, Q] (keys as rows), so row statistics come as [1, Q] rows and every matmul
    is a plain one; no full-length column array is needed."""
    b, j = pl.program_id(0), pl.program_id(2)
    family = FAMILIES[cfg.family]
    *row_refs, dk_ref, dv_ref = refs
    k, v = k_ref[...], v_ref[...]
    k_col = [kvcol_ref[x] for x in range(3)]  # each [C, 1]

    def body(g, masked, i, carry):
        dk, dv = carry
        q, dout = _rows(q_ref, (g,), i * cfg.block_q, cfg.block_q), _rows(dout_ref, (g,), i * cfg.block_q, cfg.block_q)
        rows = {name: ref[g, i] for name, ref in zip(family.rows, row_refs)}  # each [1, Q]
        vis_t = visible(cfg, qrow_ref[0, i], qrow_ref[1, i], *k_col) if masked else None
        w_t, ds_t = family.grad(dot(k, q, NT), vis_t, _ctx(cfg, n_ref[i], p_ref), rows, dot(v, dout, NT))
        return dk + dot(ds_t.astype(q.dtype), q, NN), dv + dot(w_t.astype(dout.dtype), dout, NN)

    carry = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    full = (full_ref[0, b, j], full_ref[1, b, j])
    for g in range(cfg.kv_groups):
        masked, interior = functools.partial(body, g, True), functools.partial(body, g, False)
        carry = sweep_spans(first_ref[b, j], end_ref[b, j], full, masked, interior, carry)
    dk_ref[...], dv_ref[...] = carry
