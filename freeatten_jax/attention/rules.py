"""The four row normalisations (docs/method.md §3) written once: blockwise, the ring and the Pallas kernels use these.

Glossary: s scores, vis mask (None: every pair visible, the kernels' interior blocks), u / r / w weights,
dp = dO·Vᵀ, ds the score gradient: block arrays whose last axis is the key (rows reduce over it); row
statistics broadcast against them ([.., Q, 1]; key-major [1, Q] in the dK/dV kernels, where only the
elementwise `grad` runs); acc [.., Q, D]. A Family is its forward passes (each a fold over the visible key
blocks: init, step, finish, and merge, which joins the carries of folds over disjoint key sets), the row terms
of its gradient and the elementwise gradient of one block.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from freeatten_jax.attention.variants import NEG_INF, REWEIGHT_MARGIN, reweight_offset

TINY = float(jnp.finfo(jnp.float32).tiny)
LOG2E = 1.4426950408889634


def mul_add(a, b, c):
    """a * b + c (one FMA where the compiler contracts it)."""
    return a * b + c


def reciprocal(x):
    """1 / x (an IEEE division where nothing faster is asked for)."""
    return 1.0 / x


# log2(1 + t) / t on [0, 1], highest degree first: degree 7, a minimax fit (iteratively re-weighted least squares at
# Chebyshev nodes; relative error 2.3e-7). t·P(t) in float32 Horner has relative error < 4e-7 for every t in [0, 1]
# (tests/attention/test_degenerate.py), with FMAs only: no log (libdevice's log2f is ~20 FP32 instructions on a GPU), no branch
# for small t. Degree 8 (one more FMA a score, 2e-7) bought float32 accuracy that no bfloat16 kernel can use.
LOG2_1P = (
    -0.012027023664008344,
    0.06257091005174537,
    -0.15390368302553017,
    0.2550034650606223,
    -0.3530342518745959,
    0.4800017605672439,
    -0.721306058363872,
    1.4426947169956232,
)
# Degree 4 of the same fit, for kernels whose weights are 16-bit only (mosaic_gpu.py): relative error 5.7e-5 in float32
# Horner (tests/attention/pallas/test_mosaic_gpu.py), 34x below bfloat16's and 8x below float16's half-ulp (2^-9,
# 2^-11), three FMAs a score fewer. Not float32's: its rows would carry the 5.7e-5.
LOG2_1P_4 = (0.05965203678342876, -0.22712044135444287, 0.44189946261727187, -0.7169875450286584, 1.4426132125076534)


def log2_1p(t, plus=0.0, fma=mul_add, coeffs=LOG2_1P):
    """plus + log2(1 + t) for t in [0, 1] as plus + t·P(t) (P's coefficients `coeffs`, highest degree first), in
    Horner's form: one fma per coefficient, the last taking `plus` (softplus's max(s, 0)) with it."""
    acc = fma(t, coeffs[0], coeffs[1])
    for c in coeffs[2:]:
        acc = fma(acc, t, c)
    return fma(acc, t, plus)


def log2_1p_eup(t, plus=0.0):
    """plus + log2(1 + t) for t in [0, 1] by the hardware log, where it is one transcendental-unit op (a TPU's vlog2; the
    polynomial's eight VPU ops cost more there), with a 3-term series below 2^-6 for small t."""
    return plus + jnp.where(t < 2.0**-6, t * (LOG2E + t * (LOG2E * -0.5 + t * (LOG2E / 3.0))), jnp.log2(1.0 + t))


def _row_sum(x):
    return jnp.sum(x, axis=-1, keepdims=True)


def static_power(p):
    """p as an int when it is a known whole number (an exact, cheap integer power), else None."""
    if isinstance(p, (int, float)) and float(p).is_integer() and 1 <= p <= 64:
        return int(p)
    return None


class Ctx(NamedTuple):
    """What a family sees of the current query block besides its scores."""

    n: Any  # N_i, float32, broadcasting against the block's rows
    p: Any  # float32 scalar, LSSAR's power
    static_power: int | None  # p when a known whole number (an exact integer power)
    weight: Callable | None  # the variant's elementwise weight(s, n), for the "none" family
    pv: Callable  # pv(w, v, acc) = acc + Σ_j w_ij v_j in float32, in the caller's layout (a kernel adds in the matmul)
    log2_1p: Callable = log2_1p  # (t, plus) -> plus + log2(1 + t), t in [0, 1] (a kernel may take the hardware's log)
    rcp: Callable = reciprocal  # 1 / x, elementwise (the hardware's reciprocal where an IEEE division is slow)
    exp2: Callable = jnp.exp2  # 2^x, elementwise (a GPU kernel flushes results below 2^-126 to 0: no subnormal fix-up)
    pv_once: Callable | None = None  # pv with the weights rounded once to the matmul dtype (None: pv), for LSSAR's y
    row_sum: Callable = _row_sum  # Σ_j w_ij [.., Q, 1] of weights that pv takes (a kernel sums them as pv rounds them)


def add_up(carry, total, top):
    """merge of a carry of sums (Z_i, accumulators): their totals."""
    return total(carry)


class Pass(NamedTuple):
    """One fold over the visible key blocks: step(carry, s, vis, v, ctx, rows); finish(carry, ctx) gives the
    output (None before the last pass) and the row statistics it adds to `rows`. merge(carry, total, top) is
    the carry of the union of disjoint key sets from each set's carry, given `total` (a sum over the sets) and
    `top` (a max over them): a KV cache sharded over a mesh axis merges with psum and pmax (sharded_decode.py)."""

    init: Callable  # init(row0 [.., Q, 1], acc0 [.., Q, D]) -> carry
    step: Callable
    finish: Callable
    with_values: bool = True  # the step reads v
    merge: Callable = add_up


class Family(NamedTuple):
    """`stats` / `extras` name the [Q, 1] / [Q, D] statistics the forward saves, `rows` what grad reads
    (backward_rows' keys); power_grad (LSSAR only; grad's arguments) is each score's share of dL/dp.
    score_scale: the family reads scores times this (log2 e: it works in base 2, the constant cancels in
    the normalisation); its ds is still dL/d(score), so an implementation folds the factor into the scores
    (per query row in the kernels) and nothing else."""

    passes: tuple[Pass, ...]
    backward_rows: Callable  # (stats, out, dout, p) -> rows
    grad: Callable  # (s, vis, ctx, rows, dp) -> (w for dV, ds for dQ and dK)
    stats: tuple[str, ...]
    extras: tuple[str, ...]
    rows: tuple[str, ...]
    power_grad: Callable | None = None
    score_scale: float = 1.0
    output_passes: tuple[Pass, ...] | None = None  # the passes when no gradient follows (None: `passes`)


def output_only(family: Family) -> Family:
    """The family's forward when no gradient follows: its output passes (LSSAR's second pass without the
    backward's sums), no statistics saved."""
    return family._replace(passes=family.output_passes or family.passes, stats=(), extras=())


def forward(family: Family, sweep: Callable, ctx: Ctx):
    """(out, statistics), each pass folded by `sweep(init, step(carry, s, vis, v), with_values)`."""
    out, rows = None, dict[str, Any]()
    for one in family.passes:
        step = lambda carry, s, vis, v, one=one, rows=rows: one.step(carry, s, vis, v, ctx, rows)  # noqa: E731
        out, new = one.finish(sweep(one.init, step, one.with_values), ctx)
        rows = {**rows, **new}
    return out, rows


def neg_abs(x):
    """-|x| for float32 x by setting its sign bit: one bitwise op (abs, then negate, is two on a TPU)."""
    return jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(x, jnp.uint32) | jnp.uint32(0x80000000), jnp.float32)


def softplus_and_sigmoid(s2, log2_1p_fn=log2_1p, rcp=reciprocal, exp2=jnp.exp2):
    """softplus in base 2, log2(1 + 2^s2) = softplus(s) / ln 2 for s2 = s log2 e, and sigmoid(s), sharing one
    exp2 of -|s2|: max(s2, 0) + log2(1 + t) with t = 2^-|s2| in (0, 1], accurate down to t = 2^-126."""
    t = exp2(neg_abs(s2))
    return log2_1p_fn(t, jnp.maximum(s2, 0.0)), jnp.where(s2 >= 0, 1.0, t) * rcp(1.0 + t)


def _softplus_and_sigmoid(s2, ctx: Ctx):
    """softplus_and_sigmoid with the log, reciprocal and exp2 the caller's context takes."""
    return softplus_and_sigmoid(s2, ctx.log2_1p, ctx.rcp, ctx.exp2)


def power_minus_one(y, ctx: Ctx):
    """y ** (p - 1) for y > 0: an exact integer power when p is a known whole number."""
    if ctx.static_power is not None:
        return jax.lax.integer_pow(y, ctx.static_power - 1)
    return jnp.exp((ctx.p - 1.0) * jnp.log(y))


def _keep(vis, x, fill):
    """x where visible, else fill; an interior block (vis None: every pair visible) takes x as it is."""
    return x if vis is None else jnp.where(vis, x, fill)


def _row_max(x):
    return jnp.max(x, axis=-1, keepdims=True)


def dot_rows(x, y):
    """Σ_d x_id y_id in float32, as [.., Q, 1]."""
    return _row_sum(x.astype(jnp.float32) * y.astype(jnp.float32))


def _zeros_and_accumulator(row0, acc0):
    return row0, acc0


# ----------------------------------------------------------------------------- softmax (softmax, ssmax)


def _softmax_step(carry, s, vis, v, ctx, rows):
    """Online softmax in base 2: running max m, running sum l, rescaled accumulator."""
    m, l, acc = carry
    s = _keep(vis, s, NEG_INF)
    m_new = jnp.maximum(m, _row_max(s))
    w = _keep(vis, ctx.exp2(s - m_new), 0.0)
    scale = ctx.exp2(m - m_new)
    return m_new, l * scale + _row_sum(w), ctx.pv(w, v, acc * scale)


def _softmax_merge(carry, total, top):
    """The running max over every set first, then each set's sums rescaled to it (base 2, as the step)."""
    m, l, acc = carry
    m_all = top(m)
    scale = jnp.exp2(m - m_all)
    return m_all, total(l * scale), total(acc * scale)


def _softmax_finish(carry, ctx):
    m, l, acc = carry
    l = jnp.maximum(l, TINY)
    return jnp.where(ctx.n > 0, acc / l, 0.0), {"lse": m + jnp.log2(l)}


def _softmax_grad(s, vis, ctx, rows, dp):
    w = _keep(vis, ctx.exp2(s - rows["lse"]), 0.0)
    return w, _keep(vis, w * (dp - rows["d"]), 0.0)


# ----------------------------------------------------------------------------- sum (lssa)


def _sum_step(carry, s, vis, v, ctx, rows):
    """u = softplus(s) >= 0 grows at most linearly in a bounded score: no running max, no rescale."""
    z, acc = carry
    u = _keep(vis, _softplus_and_sigmoid(s, ctx)[0], 0.0)
    return z + ctx.row_sum(u), ctx.pv(u, v, acc)


def _sum_finish(carry, ctx):
    z, acc = carry
    z = jnp.maximum(z, TINY)
    return acc / z, {"z": z}


def _sum_grad(s, vis, ctx, rows, dp):
    u, slope = _softplus_and_sigmoid(s, ctx)
    return _keep(vis, u * rows["inv_z"], 0.0), _keep(vis, (dp - rows["d"]) * (slope * (LOG2E * rows["inv_z"])), 0.0)


def _sum_backward_rows(stats, out, dout, p):
    """D_i and 1 / Z_i (Z in base 2: dL/ds divides by ln 2 Z, hence grad's log2 e), once per row."""
    return {"inv_z": 1.0 / stats["z"], "d": dot_rows(dout, out)}


# ----------------------------------------------------------------------------- none (sigmoid, relu)


def _none_step(acc, s, vis, v, ctx, rows):
    return ctx.pv(_keep(vis, ctx.weight(s, ctx.n), 0.0), v, acc)


def _none_grad(s, vis, ctx, rows, dp):
    w, slope = jax.jvp(lambda x: ctx.weight(x, ctx.n), (s,), (jnp.ones_like(s),))
    return _keep(vis, w, 0.0), _keep(vis, dp * slope, 0.0)


# ----------------------------------------------------------------------------- reweight (lssar)
# A score is re-weighted when x_ij = N_i u_ij / Z_i - o_i > 0, that is when u_ij > θ_i = o_i Z_i / N_i. Pass 1
# gives Z_i and u_max; a row is sharp when x_max > REWEIGHT_MARGIN (u_max > θ_i (1 + margin)) and its scores
# count where u_ij > θ_i: comparisons of stored values, so a sharp row always keeps its largest score (once,
# q = 0 rows lost every weight when x_max and x were rounded by different expressions). Pass 2 forms
# ρ_ij = (u_ij - θ_i) α_i with α_i = 1 / (u_max - θ_i): ρ = x / x_max in (0, 1], so r = ρ^p needs no running
# max and no per-score division, and u - θ > 0 is exact wherever u > θ. A row with nothing above θ keeps its
# LSSA weights: θ = 0, α = 1 / u_max and power 1 (r = u / u_max). Pass 2 also accumulates
# Σ_j ρ^(p-1) v_j and Σ_j ρ^(p-1) (r / x = ρ^(p-1) α Z / N), which make the backward a single sweep; when no
# gradient follows (Family.output_passes) it forms only r and its sums.


def _reweight_terms(s, vis, ctx, rows):
    """sigmoid(s), whether each score counts, ρ^(p-1) there (1 on a flat row, 0 where it does not count) and
    r = ρ^p (ρ on a flat row), each before the row normalisation."""
    u, slope = _softplus_and_sigmoid(s, ctx)
    active = u > rows["thr"] if vis is None else vis & (u > rows["thr"])
    rho = jnp.where(active, (u - rows["thr"]) * rows["alpha"], 1.0)
    rho_pm1 = jnp.where(active, jnp.where(rows["sharp"] > 0, power_minus_one(rho, ctx), 1.0), 0.0)
    return slope, active, rho, rho_pm1, rho_pm1 * rho


def _reweight_step1(carry, s, vis, v, ctx, rows):
    z, u_max = carry
    u = _keep(vis, _softplus_and_sigmoid(s, ctx)[0], 0.0)
    return z + _row_sum(u), jnp.maximum(u_max, _row_max(u))  # float32: θ_i compares Z_i with u


def _reweight_merge1(carry, total, top):
    """Z_i and u_max over every set, before finish1 derives θ_i, α_i and the sharpness from them: pass 2's
    weights ρ_ij = (u_ij - θ_i) α_i need the whole row's Z_i, so a partial one cannot be merged later."""
    z, u_max = carry
    return total(z), top(u_max)


def _reweight_finish1(carry, ctx):
    z, u_max = carry
    z = jnp.maximum(z, TINY)
    thr = reweight_offset(ctx.n) * z / jnp.maximum(ctx.n, 1.0)
    sharp = u_max > thr * (1.0 + REWEIGHT_MARGIN)  # x_max > the margin; then u_max > θ, so some score counts
    thr = jnp.where(sharp, thr, 0.0)
    alpha = 1.0 / jnp.maximum(u_max - thr, TINY)
    n_1 = jnp.maximum(ctx.n, 1.0)
    return None, {"z": z, "thr": thr, "alpha": alpha, "sharp": sharp.astype(jnp.float32), "azn": alpha * z / n_1}


def _reweight_step2(carry, s, vis, v, ctx, rows):
    l, acc, l_dx, acc_dx = carry
    _, _, _, rho_pm1, r = _reweight_terms(s, vis, ctx, rows)
    y = (ctx.pv_once or ctx.pv)(rho_pm1, v, acc_dx)  # only the gradient's E_i reads y: one rounding of ρ^(p-1) is enough
    return l + ctx.row_sum(r), ctx.pv(r, v, acc), l_dx + ctx.row_sum(rho_pm1), y


def _reweight_output_step(carry, s, vis, v, ctx, rows):
    """Pass 2 when no gradient follows: only Σ_j r_ij v_j and Σ_j r_ij."""
    l, acc = carry
    r = _reweight_terms(s, vis, ctx, rows)[-1]
    return l + ctx.row_sum(r), ctx.pv(r, v, acc)


def _reweight_output_finish(carry, ctx):
    l, acc = carry
    return acc / jnp.maximum(l, TINY), {}


def _reweight_finish2(carry, ctx):
    l, acc, l_dx, acc_dx = carry
    return _reweight_output_finish((l, acc), ctx)[0], {"l": jnp.maximum(l, TINY), "c": l_dx, "y": acc_dx}


def _reweight_backward_rows(stats, out, dout, p):
    """The row constants of the gradient, each computed once: D_i; E_i = Σ_j da_ij a_ij, which for a sharp
    row is o_i p Σ_j (r_ij / x_ij) (dp_ij - D_i) / l_i, with r / x = ρ^(p-1) α Z / N (o_i = 1 where θ_i > 0);
    the factor p α Z / l of ρ^(p-1) in N p A / x (1 on a flat row); 1 / Z and 1 / l."""
    d = dot_rows(dout, out)
    sharp, inv_l = stats["sharp"] > 0, 1.0 / stats["l"]
    e = p * stats["azn"] * inv_l * (dot_rows(dout, stats["y"]) - d * stats["c"])
    return {
        "thr": stats["thr"],
        "alpha": stats["alpha"],
        "sharp": stats["sharp"],
        "d": d,
        "e": jnp.where(sharp & (stats["thr"] > 0), e, 0.0),
        "factor": jnp.where(sharp, p * stats["alpha"] * stats["z"] * inv_l, 1.0),
        "inv_z": LOG2E / stats["z"],  # dL/ds divides by Z in natural units, ln 2 times Z in base 2
        "inv_l": inv_l,
    }


def _reweight_grad(s, vis, ctx, rows, dp):
    slope, _, _, rho_pm1, r = _reweight_terms(s, vis, ctx, rows)
    ds = ((dp - rows["d"]) * (rho_pm1 * rows["factor"]) - rows["e"]) * (slope * rows["inv_z"])
    return r * rows["inv_l"], _keep(vis, ds, 0.0)


def _reweight_power_grad(s, vis, ctx, rows, dp):
    """dL/dp per score: A_ij = x_ij^p / Σ_k x_ik^p gives dA_ij/dp = A_ij (log x_ij - Σ_k A_ik log x_ik), so
    dL/dp = Σ_ij A_ij log x_ij (dp_ij - D_i) on sharp rows (the others do not use p). A row constant added to
    log x cancels, as Σ_j A_ij (dp_ij - D_i) = 0: log ρ = log x - log x_max is enough."""
    _, active, rho, _, r = _reweight_terms(s, vis, ctx, rows)
    return jnp.where(active & (rows["sharp"] > 0), r * rows["inv_l"] * jnp.log(rho) * (dp - rows["d"]), 0.0)


def _rows_with_d(*names):
    """backward_rows keeping the named statistics and adding D_i = dO_i·O_i."""
    return lambda stats, out, dout, p: {**{name: stats[name] for name in names}, "d": dot_rows(dout, out)}


_REWEIGHT_PASS1 = Pass(lambda row0, acc0: (row0, row0), _reweight_step1, _reweight_finish1, False, _reweight_merge1)

FAMILIES = {
    "softmax": Family(
        (Pass(lambda row0, acc0: (row0 + NEG_INF, row0, acc0), _softmax_step, _softmax_finish, merge=_softmax_merge),),
        _rows_with_d("lse"),
        _softmax_grad,
        ("lse",),
        (),
        ("lse", "d"),
        score_scale=LOG2E,
    ),
    "sum": Family(
        (Pass(_zeros_and_accumulator, _sum_step, _sum_finish),),
        _sum_backward_rows,
        _sum_grad,
        ("z",),
        (),
        ("inv_z", "d"),
        score_scale=LOG2E,
    ),
    "none": Family(
        (Pass(lambda row0, acc0: acc0, _none_step, lambda acc, ctx: (acc, {})),), lambda *_: {}, _none_grad, (), (), ()
    ),
    "reweight": Family(
        (
            _REWEIGHT_PASS1,
            Pass(lambda row0, acc0: (row0, acc0, row0, acc0), _reweight_step2, _reweight_finish2),
        ),
        _reweight_backward_rows,
        _reweight_grad,
        ("z", "thr", "alpha", "sharp", "azn", "l", "c"),
        ("y",),
        ("thr", "alpha", "sharp", "d", "e", "factor", "inv_z", "inv_l"),
        _reweight_power_grad,
        LOG2E,
        (_REWEIGHT_PASS1, Pass(_zeros_and_accumulator, _reweight_output_step, _reweight_output_finish)),
    ),
}
