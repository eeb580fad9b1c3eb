"""GPU Pallas kernel bodies (forward, dQ, dK/dV) running the shared row rules (rules.FAMILIES, docs/method.md §3).

Glossary: Q / C query / key block length, D head dim, G = H // K query heads per kv head. In a kernel
every array is 2-D: scores s, mask vis, weights w, ds are [Q, C] (key-major [C, Q] in the dkv kernel,
where row statistics come as [1, Q] rows; the family maths is elementwise, so it serves both); row
statistics [Q, 1]; blocks of q, k, v, out [Q|C, D]. A `rules.Family` holds one normalisation's math; the three kernels
(forward, dq, dkv) stream key (or query) blocks between the bounds that pallas_plan computed, so
provably invisible block pairs cost nothing, and the run of wholly visible (interior) blocks is swept
without any mask (`vis` None; issue 20: masking every block cost 3x the instructions of the softmax
forward on an H100). Masked scores use `where`, and key rows hidden from the
whole query block are zeroed before any matmul that contracts over keys (docs/method.md §8: NaN/Inf there
never reach a visible output or gradient).
"""

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from freeatten_jax.attention.rules import FAMILIES, Ctx, Family, forward, log2_1p, log2_1p_eup, output_only

NT = (((1,), (1,)), ((), ()))  # a [M, D] x b [N, D] -> [M, N]
NN = (((1,), (0,)), ((), ()))  # a [M, N] x b [N, D] -> [M, D]


def dot(a, b, dims):
    """A float32-accumulated matmul; float32 operands at full precision, others on the tensor cores."""
    precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def scaled_scores(a, b, a_scale, b_scale):
    """The scores a_i b_j (x_i·y_j) as the family reads them: the matmul on the inputs as given (bfloat16 inputs
    rounded once, by the caller), the [M, 1] / [1, N] factors (None: none) applied in float32."""
    s = dot(a, b, NT)
    s = s if a_scale is None else s * a_scale
    return s if b_scale is None else s * b_scale


def weighted_dot(split: bool, w, x, acc):
    """acc + w @ x (w float32: weights or ds) on the tensor cores, accumulated in float32. With `split` (and x not
    float32), w runs as two halves in x's dtype, w = hi + lo: the result is as exact as with float32 w (error
    ~2^-17 of w instead of bfloat16's 2^-9) for one more matmul. Each matmul's sum is `dot + acc`, the form
    Triton folds into the matmul's own accumulator (acc + (hi + lo) cost two float32 adds per element)."""
    hi = w.astype(x.dtype)
    if split and x.dtype != jnp.float32:
        acc = dot((w - hi.astype(jnp.float32)).astype(x.dtype), x, NN) + acc
    return dot(hi, x, NN) + acc


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
    key_scale: bool  # the scores carry a per-key factor b_j (LSSA, LSSAR); the per-query a_i always
    split: bool  # the weights and ds enter their matmuls as two halves (weighted_dot)
    ptx: bool = False  # a CUDA compile: fused multiply-adds as inline PTX (fma_ptx)
    eup_log: bool = False  # the TPU kernels: log2(1 + t) by the transcendental unit (rules.log2_1p_eup)
    plain_length: int | None = None  # T (= S) of a plain mask (Mask.plain): its causal block spans known when tracing
    residuals: bool = True  # the forward also writes what the backward reads (statistics, extras, the low half)
    block_k_dkv: int | None = None  # the GPU dK/dV kernel's key block, a divisor of block_k (None: block_k)


def dkv_split(cfg: Static) -> int:
    """How many key sub-blocks the GPU dK/dV kernel runs each key block as (its dK and dV accumulators are
    [block_k / split, D] float32 each: 128 registers a thread for 64 keys at D = 128 on 4 warps, which spill)."""
    if cfg.block_k_dkv is None or cfg.block_k_dkv >= cfg.block_k:
        return 1
    if cfg.block_k % cfg.block_k_dkv:
        raise ValueError(f"block_k_dkv={cfg.block_k_dkv} must divide the key block length {cfg.block_k}")
    return cfg.block_k // cfg.block_k_dkv


def kernel_family(cfg: Static) -> Family:
    """The family the forward kernels run: the whole one, or its output passes alone when no gradient follows."""
    return FAMILIES[cfg.family] if cfg.residuals else output_only(FAMILIES[cfg.family])


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
    return vis, column(jnp.max(vis.astype(jnp.float32), axis=0, keepdims=True)) > 0


def column(x_1N):
    """A [1, N] row as an [N, 1] column, through an [8, N] transpose, which every backend lowers: per-row
    values travel lane-dense in HBM ([.., 1, N]; a [.., N, 1] float32 array is padded 128x on a TPU)."""
    return jnp.max(jnp.broadcast_to(x_1N, (8, x_1N.shape[1])).T, axis=1, keepdims=True)


def row(x_N1):
    """An [N, 1] column as a [1, N] row (column's inverse), through an [N, 128] transpose: a statistic written
    lane-dense."""
    return jnp.max(jnp.broadcast_to(x_N1, (x_N1.shape[0], 128)).T, axis=0, keepdims=True)


def low_half(cfg: Static) -> bool:
    """Whether the forward also writes the output's low half, the residual that keeps D_i = dO_i·O_i exact: below
    float32, when a gradient follows. Without it SSMax's dk is 2.5x the bfloat16 reference's error (its sharp rows
    amplify O's rounding in D_i), beyond the 2x contract (docs/method.md)."""
    return cfg.residuals and jnp.dtype(cfg.dtype) != jnp.float32


def split_output(cfg: Static, out):
    """The float32 output as (hi, lo): hi in the input dtype and (low_half, else None) out - hi in the input dtype;
    hi + lo is the float32 output to ~2^-17, for D_i = dO_i·O_i in the backward at half a float32 residual's memory."""
    hi = out.astype(cfg.dtype)
    return hi, (out - hi.astype(jnp.float32)).astype(cfg.dtype) if low_half(cfg) else None


def write_forward(cfg: Static, family, out_refs, out, stats):
    """The output's halves (split_output) and the family's statistics (each row statistic lane-dense, as a row)."""
    hi, lo = split_output(cfg, out)
    out_refs[0][...] = hi
    for ref, name in zip(out_refs[1:], family.stats + family.extras):
        ref[...] = row(stats[name]) if name in family.stats else stats[name]
    if lo is not None:
        out_refs[-1][...] = lo


def _ptx(asm: str, *args):
    """One float32 PTX instruction elementwise over args (broadcast to one shape)."""
    from jax.experimental.pallas import triton as pltriton

    operands = jnp.broadcast_arrays(*(jnp.asarray(x, jnp.float32) for x in args))
    constraints = ",".join(["=f"] + ["f"] * len(operands))
    shape = [jax.ShapeDtypeStruct(operands[0].shape, jnp.float32)]
    return pltriton.elementwise_inline_asm(asm, args=operands, constraints=constraints, pack=1, result_shape_dtypes=shape)[0]


def fma_ptx(a, b, c):
    """a * b + c in one rounding, as PTX fma.rn.f32: Triton writes mul.rn and add.rn, which ptxas never fuses
    (the base-2 softplus's polynomial took twice the FP32 instructions)."""
    return _ptx("fma.rn.f32 $0, $1, $2, $3;", a, b, c)


def ex2_ptx(x):
    """2^x by the hardware's exp2 with results below 2^-126 flushed to 0 (PTX ex2.approx.ftz.f32): Triton's exp2 is
    the non-flushing form, which ptxas wraps in a range test and two multiplies per element."""
    return _ptx("ex2.approx.ftz.f32 $0, $1;", x)


def rcp_ptx(x):
    """1 / x by the hardware's reciprocal (PTX rcp.approx.ftz.f32, within 1 ulp) instead of an IEEE division."""
    return _ptx("rcp.approx.ftz.f32 $0, $1;", x)


def kernel_ctx(cfg: Static, n, p):
    pv = functools.partial(weighted_dot, cfg.split)
    ptx: dict[str, Callable] = dict(log2_1p=functools.partial(log2_1p, fma=fma_ptx), rcp=rcp_ptx, exp2=ex2_ptx)
    fast: dict[str, Callable] = ptx if cfg.ptx else {}
    fast |= dict(log2_1p=log2_1p_eup) if cfg.eup_log else {}
    pv_once = functools.partial(weighted_dot, False)
    return Ctx(n=n, p=p, static_power=cfg.static_power, weight=cfg.weight, pv=pv, pv_once=pv_once, **fast)


def sweep_spans(first, end, full, masked, interior, carry):
    """Folds `masked(j, carry)` over the key (or query) blocks of [first, full[0]) and [full[1], end), and
    `interior` over the run [full[0], full[1]) of wholly visible ones (pallas_plan), in order."""
    carry = jax.lax.fori_loop(first, full[0], masked, carry)
    carry = jax.lax.fori_loop(full[0], full[1], interior, carry)
    return jax.lax.fori_loop(full[1], end, masked, carry)


def key_factor(cfg: Static, ks_ref, index):
    """Key block `index`'s factors b_j as a [1, C] row (index `...`: the block a TPU grid step holds), or None
    without a key factor."""
    return ks_ref[index] if cfg.key_scale else None


def _key_sweep(cfg: Static, first_ref, end_ref, full_ref, q_ref, k_ref, v_ref, qs_ref, ks_ref, qcol_ref, kvrow_ref):
    """sweep(init, step, with_values) for one (batch, head, query block): the family's fold over the visible key blocks."""
    b, i = pl.program_id(0), pl.program_id(2)
    q, qs = q_ref[...], column(qs_ref[...])
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
            return step(carry, scaled_scores(q, k, qs, key_factor(cfg, ks_ref, j)), vis, v)

        row0 = jnp.zeros((cfg.block_q, 1), jnp.float32)
        acc0 = jnp.zeros((cfg.block_q, q.shape[1]), jnp.float32)
        full = (full_ref[0, b, i], full_ref[1, b, i])
        return sweep_spans(
            first_ref[b, i], end_ref[b, i], full, functools.partial(body, True), functools.partial(body, False), init(row0, acc0)
        )

    return sweep


def forward_kernel(cfg: Static, first_ref, end_ref, full_ref, p_ref, *refs):
    """One (batch, head, query block): out and the family's statistics, streaming visible key blocks."""
    family = kernel_family(cfg)
    (q_ref, k_ref, v_ref, qs_ref, ks_ref, qcol_ref, kvrow_ref, n_ref), out_refs = refs[:8], refs[8:]
    sweep = _key_sweep(cfg, first_ref, end_ref, full_ref, q_ref, k_ref, v_ref, qs_ref, ks_ref, qcol_ref, kvrow_ref)
    out, stats = forward(family, sweep, kernel_ctx(cfg, n_ref[...], p_ref[0]))
    write_forward(cfg, family, out_refs, out, stats)


def carry_widths(cfg: Static, which: int, d: int) -> list[int]:
    """The last-axis widths of pass `which`'s carry leaves: 1 for a [Q, 1] row statistic, D for an accumulator."""
    one = kernel_family(cfg).passes[which]
    return [x.shape[-1] for x in jax.tree.leaves(one.init(jnp.zeros((1, 1)), jnp.zeros((1, d))))]


def split_pass_refs(row_names, refs):
    """A pass kernel's refs after the inputs they share with the forward kernel: the rows of the earlier passes,
    the carry in and the carry out (as many leaves as the pass's init makes)."""
    rows = dict(zip(row_names, refs))
    leaves = (len(refs) - len(row_names)) // 2
    return rows, refs[len(row_names) : len(row_names) + leaves], refs[len(row_names) + leaves :]


def pass_kernel(cfg: Static, which: int, row_names, first_ref, end_ref, full_ref, p_ref, *refs):
    """One (batch, head, query block): pass `which` of the family continued from a carry over one more set of
    key blocks (a ring step's chunk, ring_kernels.py), the carry written out unfinished."""
    one = kernel_family(cfg).passes[which]
    (q_ref, k_ref, v_ref, qs_ref, ks_ref, qcol_ref, kvrow_ref, n_ref), rest = refs[:8], refs[8:]
    row_refs, in_refs, out_refs = split_pass_refs(row_names, rest)
    sweep = _key_sweep(cfg, first_ref, end_ref, full_ref, q_ref, k_ref, v_ref, qs_ref, ks_ref, qcol_ref, kvrow_ref)
    rows, ctx = {name: ref[...] for name, ref in row_refs.items()}, kernel_ctx(cfg, n_ref[...], p_ref[0])
    leaves, tree = jax.tree.flatten(one.init(jnp.zeros((1, 1)), jnp.zeros((1, 1))))
    carry = jax.tree.unflatten(tree, [ref[...] for ref in in_refs])
    step = lambda carry, s, vis, v: one.step(carry, s, vis, v, ctx, rows)  # noqa: E731
    for ref, x in zip(out_refs, jax.tree.leaves(sweep(lambda *_: carry, step, one.with_values))):
        ref[...] = x


def dq_kernel(
    cfg: Static,
    first_ref,
    end_ref,
    full_ref,
    p_ref,
    q_ref,
    k_ref,
    v_ref,
    qs_ref,
    ks_ref,
    qcol_ref,
    kvrow_ref,
    n_ref,
    dout_ref,
    *refs,
):
    """For one (batch, head, query block): Σ_j ds_ij b_j k_j over the visible key blocks (dL/dq_i is a_i times
    it, pallas.py) and, if cfg.p_grad, the block's rows' shares of dL/dp as a [1, Q] row."""
    b, i = pl.program_id(0), pl.program_id(2)
    family = FAMILIES[cfg.family]
    row_refs, out_refs = refs[: len(family.rows)], refs[len(family.rows) :]
    rows = {name: column(ref[...]) for name, ref in zip(family.rows, row_refs)}  # each [1, Q] in HBM
    q, qs, dout, ctx = q_ref[...], column(qs_ref[...]), dout_ref[...], kernel_ctx(cfg, n_ref[...], p_ref[0])
    q_col = (qcol_ref[0], qcol_ref[1])

    def body(masked, j, carry):
        dq, dpow = carry
        k = _rows(k_ref, (), j * cfg.block_k, cfg.block_k)
        v = _rows(v_ref, (), j * cfg.block_k, cfg.block_k)  # only through dp, whose hidden entries `where` drops
        vis = None
        if masked:
            vis, seen = key_block(cfg, [kvrow_ref[x, j] for x in range(3)], q_col)
            k = jnp.where(seen, k, 0)
        ks = key_factor(cfg, ks_ref, j)
        args = (scaled_scores(q, k, qs, ks), vis, ctx, rows, dot(dout, v, NT))
        _, ds = family.grad(*args)
        if cfg.p_grad and family.power_grad is not None:
            dpow = dpow + jnp.sum(family.power_grad(*args), axis=-1, keepdims=True)
        return weighted_dot(cfg.split, ds if ks is None else ds * ks, k, dq), dpow

    carry = (jnp.zeros(q.shape, jnp.float32), jnp.zeros((cfg.block_q, 1), jnp.float32))
    full = (full_ref[0, b, i], full_ref[1, b, i])
    carry = sweep_spans(
        first_ref[b, i], end_ref[b, i], full, functools.partial(body, True), functools.partial(body, False), carry
    )
    out_refs[0][...] = carry[0]
    if cfg.p_grad:
        out_refs[1][...] = row(carry[1])


def dkv_kernel(
    cfg: Static,
    first_ref,
    end_ref,
    full_ref,
    p_ref,
    q_ref,
    k_ref,
    v_ref,
    qs_ref,
    ks_ref,
    qrow_ref,
    kvcol_ref,
    n_ref,
    dout_ref,
    *refs,
):
    """For one (batch, kv head, key sub-block): Σ_i ds_ij a_i q_i (dL/dk_j is b_j times it) and dv, summed over
    the G query heads and visible query blocks. Key-major: blocks are [C, Q] (keys as rows), so row
    statistics and the factors a_i come as [1, Q] rows and every matmul is a plain one. A sub-block (dkv_split)
    sweeps its key block's span: a subset of a block's keys sees at most its query blocks, and all of those that
    every key of the block sees."""
    b, j = pl.program_id(0), pl.program_id(2) // dkv_split(cfg)
    family = FAMILIES[cfg.family]
    *row_refs, dk_ref, dv_ref = refs
    k, v, ks = k_ref[...], v_ref[...], column(ks_ref[...]) if cfg.key_scale else None
    k_col = [kvcol_ref[x] for x in range(3)]  # each [C, 1]

    def body(g, masked, i, carry):
        dk, dv = carry
        q, dout = _rows(q_ref, (g,), i * cfg.block_q, cfg.block_q), _rows(dout_ref, (g,), i * cfg.block_q, cfg.block_q)
        rows = {name: ref[g, i] for name, ref in zip(family.rows, row_refs)}  # each [1, Q]
        qs = qs_ref[g, i]
        vis_t = visible(cfg, qrow_ref[0, i], qrow_ref[1, i], *k_col) if masked else None
        s_t = scaled_scores(k, q, ks, qs)
        w_t, ds_t = family.grad(s_t, vis_t, kernel_ctx(cfg, n_ref[i], p_ref[0]), rows, dot(v, dout, NT))
        return weighted_dot(cfg.split, ds_t * qs, q, dk), weighted_dot(cfg.split, w_t, dout, dv)

    carry = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    full = (full_ref[0, b, j], full_ref[1, b, j])
    for g in range(cfg.kv_groups):
        masked, interior = functools.partial(body, g, True), functools.partial(body, g, False)
        carry = sweep_spans(first_ref[b, j], end_ref[b, j], full, masked, interior, carry)
    dk_ref[...], dv_ref[...] = carry
