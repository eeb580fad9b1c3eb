"""The GPU (Triton) kernels: forward, dQ, dK/dV and the ring's pass kernel, and their pallas_calls.

Glossary: B batch, H heads, K kv heads, G = H // K, Tp / Sp padded lengths, Q / C query / key block length,
I / J number of query / key blocks, D head dim (common.py: the 2-D block arrays). The forward and dQ kernels
(grid (b, h, i)) read a head's whole K and V and loop over its visible key blocks, between the spans that
plan.py computed, so provably invisible block pairs cost nothing; the run of wholly visible (interior) blocks
is swept without any mask (`vis` None: masking every block cost 3x the instructions of the softmax forward on
an H100). The key-major dK/dV kernel (grid (b, kv head, j)) sums the G query heads. Masked scores use `where`,
and key rows hidden from the whole query block are zeroed before any matmul that contracts over keys
(docs/method.md §8: NaN/Inf there never reach a visible output or gradient).
"""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from freeatten_jax.attention.pallas.common import (
    NN,
    NT,
    KernelRefs,
    Spans,
    Static,
    carry_in,
    carry_out,
    carry_shapes,
    column,
    dot,
    dq_outputs,
    first_carry,
    forward_outputs,
    fresh_carry,
    kernel_ctx,
    kernel_family,
    key_block,
    key_factor,
    row,
    scaled_scores,
    visible,
    weighted_dot,
    write_forward,
)
from freeatten_jax.attention.rules import FAMILIES, forward, log2_1p

TRITON_WARPS = 4


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


PTX_MATH: dict[str, Callable] = dict(log2_1p=functools.partial(log2_1p, fma=fma_ptx), rcp=rcp_ptx, exp2=ex2_ptx)


def rounded_row_sum(dtype, w):
    """Σ_j w_ij [Q, 1] of the weights as the unsplit weighted sum rounds them (to `dtype`), on the tensor cores: one
    [C, 16] matmul with ones (every column the sum; their max picks one exactly) in place of a float32 add a score
    (LSSA's forward 19.9 -> 19.4 instructions a score). The normaliser then sums what the numerator multiplied: LSSA's
    bf16 output error 1.85x -> 1.46x the reference's. Not on a TPU, where the matmul costs more VALU work than the adds."""
    return jnp.max(dot(w.astype(dtype), jnp.ones((w.shape[-1], 16), dtype), NN), axis=-1, keepdims=True)


def family_math(cfg: Static, ptx: bool) -> dict[str, Callable]:
    """The maths a kernel's family runs: inline PTX on a CUDA compile, jnp's elsewhere; row sums of the weights on
    the tensor cores where the weighted sums round the weights (no split, inputs below float32)."""
    rounded = not cfg.split and jnp.dtype(cfg.dtype) != jnp.float32
    return {**(PTX_MATH if ptx else {}), **({"row_sum": functools.partial(rounded_row_sum, cfg.dtype)} if rounded else {})}


def dkv_split(cfg: Static) -> int:
    """How many key sub-blocks the dK/dV kernel runs each key block as (its dK and dV accumulators are
    [block / split, D] float32 each: 128 registers a thread for 64 keys at D = 128 on 4 warps, which spill)."""
    k, k_dkv = cfg.blocks.k, cfg.blocks.k_dkv
    if k_dkv is None or k_dkv >= k:
        return 1
    if k % k_dkv:
        raise ValueError(f"block_k_dkv={k_dkv} must divide the key block length {k}")
    return k // k_dkv


def _rows(ref, lead, start, size):
    """ref[*lead, start:start + size, :] for a block-aligned dynamic start."""
    return ref[(*lead, pl.ds(pl.multiple_of(start, size), size), slice(None))]


def sweep_spans(first, end, full, masked, interior, carry):
    """Folds `masked(j, carry)` over the key (or query) blocks of [first, full[0]) and [full[1], end), and
    `interior` over the run [full[0], full[1]) of wholly visible ones (plan.py), in order."""
    carry = jax.lax.fori_loop(first, full[0], masked, carry)
    carry = jax.lax.fori_loop(full[0], full[1], interior, carry)
    return jax.lax.fori_loop(full[1], end, masked, carry)


def _sweep_outer(spans: Spans, masked, interior, carry):
    """sweep_spans over the spans of this program's (batch row, outer block): grid axes 0 and 2."""
    b, i = pl.program_id(0), pl.program_id(2)
    full = (spans.full[0, b, i], spans.full[1, b, i])
    return sweep_spans(spans.first[b, i], spans.end[b, i], full, masked, interior, carry)


def _key_sweep(cfg: Static, spans: Spans, x: KernelRefs):
    """sweep(init, step, with_values) for one (batch, head, query block): the family's fold over the visible key blocks."""
    q, qs, q_col, size = x.q[...], column(x.qs[...]), (x.q_mask[0], x.q_mask[1]), cfg.blocks.k

    def sweep(init, step, with_values=True):
        def body(masked, j, carry):
            k = _rows(x.k, (), j * size, size)
            v = _rows(x.v, (), j * size, size) if with_values else None
            vis = None
            if masked:
                vis, seen = key_block(cfg, [x.kv_mask[m, j] for m in range(3)], q_col)
                k = jnp.where(seen, k, 0)
                v = jnp.where(seen, v, 0) if with_values else None
            return step(carry, scaled_scores(q, k, qs, key_factor(cfg, x.ks, j)), vis, v)

        row0 = jnp.zeros((cfg.blocks.q, 1), jnp.float32)
        acc0 = jnp.zeros((cfg.blocks.q, q.shape[1]), jnp.float32)
        return _sweep_outer(spans, functools.partial(body, True), functools.partial(body, False), init(row0, acc0))

    return sweep


def forward_kernel(cfg: Static, ptx: bool, spans: Spans, x: KernelRefs, *out_refs):
    """One (batch, head, query block): out and the family's statistics, streaming visible key blocks."""
    family = kernel_family(cfg)
    out, stats = forward(family, _key_sweep(cfg, spans, x), kernel_ctx(cfg, x.n[...], x.p[0], family_math(cfg, ptx)))
    write_forward(cfg, family, out_refs, out, stats)


def pass_kernel(cfg: Static, ptx: bool, which: int, row_names, spans: Spans, x: KernelRefs, *out_refs):
    """One (batch, head, query block): pass `which` of the family continued from a carry (none at the ring's first
    step: the family's init) over one more set of key blocks (a ring step's chunk, ring.py), the carry written out
    unfinished."""
    one = kernel_family(cfg).passes[which]
    rows = {name: column(ref[...]) for name, ref in zip(row_names, x.rows)}  # each [1, Q] in HBM
    ctx = kernel_ctx(cfg, x.n[...], x.p[0], family_math(cfg, ptx))
    fresh = fresh_carry(one, cfg.blocks.q, x.q.shape[-1])
    carry = jax.tree.unflatten(jax.tree.structure(fresh), [carry_in(cfg, ref[...]) for ref in x.carry]) if x.carry else fresh
    step = lambda carry, s, vis, v: one.step(carry, s, vis, v, ctx, rows)  # noqa: E731
    for ref, value in zip(out_refs, jax.tree.leaves(_key_sweep(cfg, spans, x)(lambda *_: carry, step, one.with_values))):
        ref[...] = carry_out(cfg, value)


def dq_kernel(cfg: Static, ptx: bool, spans: Spans, x: KernelRefs, *out_refs):
    """For one (batch, head, query block): Σ_j ds_ij b_j k_j over the visible key blocks (dL/dq_i is a_i times
    it, core.py) and, if cfg.p_grad, the block's rows' shares of dL/dp as a [1, Q] row."""
    family, size = FAMILIES[cfg.family], cfg.blocks.k
    rows = {name: column(ref[...]) for name, ref in zip(family.rows, x.rows)}  # each [1, Q] in HBM
    q, qs, dout = x.q[...], column(x.qs[...]), x.dout[...]
    ctx, q_col = kernel_ctx(cfg, x.n[...], x.p[0], family_math(cfg, ptx)), (x.q_mask[0], x.q_mask[1])

    def body(masked, j, carry):
        dq, dpow = carry
        k = _rows(x.k, (), j * size, size)
        v = _rows(x.v, (), j * size, size)  # only through dp, whose hidden entries `where` drops
        vis = None
        if masked:
            vis, seen = key_block(cfg, [x.kv_mask[m, j] for m in range(3)], q_col)
            k = jnp.where(seen, k, 0)
        ks = key_factor(cfg, x.ks, j)
        args = (scaled_scores(q, k, qs, ks), vis, ctx, rows, dot(dout, v, NT))
        _, ds = family.grad(*args)
        if cfg.p_grad and family.power_grad is not None:
            dpow = dpow + jnp.sum(family.power_grad(*args), axis=-1, keepdims=True)
        return weighted_dot(cfg.split, ds if ks is None else ds * ks, k, dq), dpow

    carry = (jnp.zeros(q.shape, jnp.float32), jnp.zeros((cfg.blocks.q, 1), jnp.float32))
    dq, dpow = _sweep_outer(spans, functools.partial(body, True), functools.partial(body, False), carry)
    out_refs[0][...] = dq
    if cfg.p_grad:
        out_refs[1][...] = row(dpow)


def dkv_kernel(cfg: Static, ptx: bool, spans: Spans, x: KernelRefs, dk_ref, dv_ref):
    """For one (batch, kv head, key sub-block): Σ_i ds_ij a_i q_i (dL/dk_j is b_j times it) and dv, summed over
    the G query heads and visible query blocks. Key-major: blocks are [C, Q] (keys as rows), so row
    statistics and the factors a_i come as [1, Q] rows and every matmul is a plain one. A sub-block (dkv_split)
    sweeps its key block's span: a subset of a block's keys sees at most its query blocks, and all of those that
    every key of the block sees."""
    b, j = pl.program_id(0), pl.program_id(2) // dkv_split(cfg)
    family, size, math = FAMILIES[cfg.family], cfg.blocks.q, family_math(cfg, ptx)
    k, v, ks = x.k[...], x.v[...], column(x.ks[...]) if cfg.key_scale else None
    k_col = [x.kv_mask[m] for m in range(3)]  # each [C, 1]

    def body(g, masked, i, carry):
        dk, dv = carry
        q, dout = _rows(x.q, (g,), i * size, size), _rows(x.dout, (g,), i * size, size)
        rows = {name: ref[g, i] for name, ref in zip(family.rows, x.rows)}  # each [1, Q]
        qs = x.qs[g, i]
        vis_t = visible(cfg, x.q_mask[0, i], x.q_mask[1, i], *k_col) if masked else None
        args = (scaled_scores(k, q, ks, qs), vis_t, kernel_ctx(cfg, x.n[i], x.p[0], math), rows, dot(v, dout, NT))
        w_t, ds_t = family.grad(*args)
        return weighted_dot(cfg.split, ds_t * qs, q, dk), weighted_dot(cfg.split, w_t, dout, dv)

    carry = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    full = (spans.full[0, b, j], spans.full[1, b, j])
    for g in range(cfg.kv_groups):
        masked, interior = functools.partial(body, g, True), functools.partial(body, g, False)
        carry = sweep_spans(spans.first[b, j], spans.end[b, j], full, masked, interior, carry)
    dk_ref[...], dv_ref[...] = carry


# ----------------------------------------------------------------------------- the pallas_calls


# The blocks (block_q, block_k) per family, from the device check's sweep (benchmarks/RESULTS.md, H200, T = 8K,
# fwd+bwd): LSSAR 8.3 ms at 64 x 32 against 10.8 at 64 x 64 (its dK/dV accumulators spill at 64 keys); softmax and
# LSSA fastest at 64 x 64 (4.1 and 6.2 ms).
GPU_BLOCKS = {"reweight": (64, 32)}
GPU_DEFAULT_BLOCKS = (64, 64)


def blocks(family: str) -> tuple[int, int]:
    """The default (block_q, block_k) of a family's kernels (GPU_BLOCKS)."""
    return GPU_BLOCKS.get(family, GPU_DEFAULT_BLOCKS)


def _common(interpret: bool, warps: int = TRITON_WARPS):
    """The pallas_call arguments every GPU kernel shares: Triton's warps and stages (none in interpret mode)."""
    from jax.experimental.pallas import triton as pltriton

    params = None if interpret else pltriton.CompilerParams(num_warps=warps, num_stages=2)
    return dict(interpret=interpret, compiler_params=params)


WHOLE = pl.BlockSpec()
WHOLE_SPANS = Spans(WHOLE, WHOLE, WHOLE)


def _query_major_specs(cfg: Static, shapes) -> tuple[KernelRefs, pl.BlockSpec, pl.BlockSpec]:
    """The forward, dq and pass kernels' input specs (grid (b, h, i)), and the specs of a [Q, D] block and of a
    lane-dense [1, Q] row (a query block's factors, row statistics, rows and a pass's row carries)."""
    (b, h, tp, d), (kv_heads, sp) = shapes
    (block_q, block_k, _), k_blocks, g = cfg.blocks, sp // cfg.blocks.k, cfg.kv_groups
    q_spec = pl.BlockSpec((None, None, block_q, d), lambda b, h, i: (b, h, i, 0))
    row_spec = pl.BlockSpec((None, None, None, 1, block_q), lambda b, h, i: (b, h, i, 0, 0))
    kv_full = pl.BlockSpec((None, None, sp, d), lambda b, h, i: (b, jax.lax.div(h, g), 0, 0))
    specs = KernelRefs(
        p=WHOLE,
        q=q_spec,
        k=kv_full,
        v=kv_full,
        qs=row_spec,
        ks=pl.BlockSpec((None, None, k_blocks, 1, block_k), lambda b, h, i: (b, jax.lax.div(h, g), 0, 0, 0)),
        q_mask=pl.BlockSpec((2, None, block_q, 1), lambda b, h, i: (0, b, i, 0)),
        kv_mask=pl.BlockSpec((3, None, k_blocks, 1, block_k), lambda b, h, i: (0, b, 0, 0, 0)),
        n=pl.BlockSpec((None, block_q, 1), lambda b, h, i: (b, i, 0)),
    )
    return specs, q_spec, row_spec


def pass_call(cfg: Static, shapes, which: int, row_names, fresh: bool, ptx: bool, interpret: bool):
    """The pass kernel's pallas_call: the forward's inputs, the earlier passes' rows and the carry in (fresh: none,
    the ring's first step); the carry out (aliasing the carry in)."""
    (b, h, tp, _), _ = shapes
    specs, q_spec, row_spec = _query_major_specs(cfg, shapes)
    carries = carry_shapes(cfg, shapes, which)
    carry_specs = tuple(row_spec if len(x.shape) == 5 else q_spec for x in carries)
    in_specs = (WHOLE_SPANS, specs._replace(rows=(row_spec,) * len(row_names), carry=() if fresh else carry_specs))
    return pl.pallas_call(
        functools.partial(pass_kernel, cfg, ptx, which, tuple(row_names)),
        grid=(b, h, tp // cfg.blocks.q),
        in_specs=in_specs,
        out_specs=list(carry_specs),
        out_shape=carries,
        input_output_aliases={} if fresh else {first_carry(in_specs) + x: x for x in range(len(carries))},
        name=f"freeatten_{cfg.family}_pass{which}",
        **_common(interpret),
    )


def calls(cfg: Static, shapes, ptx: bool, interpret: bool):
    """The three pallas_calls (forward, dq, dkv) for arrays of the given padded shapes, each called as
    call(spans, KernelRefs)."""
    (b, h, tp, d), (kv_heads, sp) = shapes
    (block_q, block_k, _), g = cfg.blocks, cfg.kv_groups
    q_blocks, k_blocks = tp // block_q, sp // block_k
    family, f32 = FAMILIES[cfg.family], jnp.float32
    common = _common(interpret)

    # forward and dq: grid (b, h, i); row statistics and rows lane-dense, one [1, Q] row per block
    specs, q_spec, row_spec = _query_major_specs(cfg, shapes)
    out_specs, out_shape = forward_outputs(cfg, shapes, q_spec, row_spec)
    forward = pl.pallas_call(
        functools.partial(forward_kernel, cfg, ptx),
        grid=(b, h, q_blocks),
        in_specs=(WHOLE_SPANS, specs),
        out_specs=out_specs,
        out_shape=out_shape,
        name=f"freeatten_{cfg.family}_fwd",
        **common,
    )
    dq_specs, dq_shape = dq_outputs(cfg, shapes, q_spec, row_spec)
    dq = pl.pallas_call(
        functools.partial(dq_kernel, cfg, ptx),
        grid=(b, h, q_blocks),
        in_specs=(WHOLE_SPANS, specs._replace(dout=q_spec, rows=(row_spec,) * len(family.rows))),
        out_specs=dq_specs,
        out_shape=dq_shape,
        name=f"freeatten_{cfg.family}_dq",
        **common,
    )

    # dkv: grid (b, kv head, j), key-major, j a key sub-block of `sub` keys (dkv_split of them a key block)
    split = dkv_split(cfg)
    sub = block_k // split
    group_spec = pl.BlockSpec((None, g, tp, d), lambda b, k, j: (b, k, 0, 0))
    group_rows = pl.BlockSpec((None, g, q_blocks, 1, block_q), lambda b, k, j: (b, k, 0, 0, 0))
    k_spec = pl.BlockSpec((None, None, sub, d), lambda b, k, j: (b, k, j, 0))
    dkv_specs = KernelRefs(
        p=WHOLE,
        q=group_spec,
        k=k_spec,
        v=k_spec,
        qs=group_rows,
        ks=pl.BlockSpec((None, None, None, 1, sub), lambda b, k, j: (b, k, j // split, 0, j % split)),
        q_mask=pl.BlockSpec((2, None, q_blocks, 1, block_q), lambda b, k, j: (0, b, 0, 0, 0)),
        kv_mask=pl.BlockSpec((3, None, sub, 1), lambda b, k, j: (0, b, j, 0)),
        n=pl.BlockSpec((None, q_blocks, 1, block_q), lambda b, k, j: (b, 0, 0, 0)),
        dout=group_spec,
        rows=(group_rows,) * len(family.rows),
    )
    dkv = pl.pallas_call(
        functools.partial(dkv_kernel, cfg, ptx),
        grid=(b, kv_heads, k_blocks * split),
        in_specs=(WHOLE_SPANS, dkv_specs),
        out_specs=[k_spec, k_spec],
        out_shape=[jax.ShapeDtypeStruct((b, kv_heads, sp, d), f32)] * 2,
        name=f"freeatten_{cfg.family}_dkv",
        **common,
    )
    return forward, dq, dkv
