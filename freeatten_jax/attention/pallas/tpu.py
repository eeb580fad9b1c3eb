"""The TPU (Mosaic) kernels: K/V streamed along an "arbitrary" grid axis, VMEM scratch accumulators.

Glossary: B batch, H heads, K kv heads, G = H // K, Tp / Sp padded lengths, Q / C query / key block
length, I / J number of query / key blocks, D head dim, R / L a schedule's grid rows and steps a row. The
forward and dQ kernels run on a grid (b, h, r, t) whose last axis walks the key blocks of the query blocks
of row r (each pass in turn: LSSAR's forward sweeps twice), and the dK/dV kernel on (b, kv head, r, t) whose
last axis walks the query blocks, each for the G heads of a group, of row r's key blocks (tpu_schedule: a
plain causal mask folds its triangle of block pairs into rows without an empty step). Each grid step holds
one block of each operand in VMEM, so VMEM use does not grow with the sequence (the GPU kernels, gpu.py, read
whole K/V and loop inside the kernel instead). Blocks outside the span that plan.py computed are not visited,
and their index map repeats a visited block, so Pallas fetches nothing for them; wholly visible (interior)
blocks skip the mask. The families' maths (rules.FAMILIES) is shared: here a `sweep` keeps its carry in
scratch between grid steps, and log2(1 + t) runs on the transcendental unit (rules.log2_1p_eup).
"""

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from freeatten_jax.attention.pallas.common import (
    NT,
    KernelRefs,
    Spans,
    Static,
    carry_in,
    carry_out,
    carry_shapes,
    carry_widths,
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
    low_half,
    pack,
    row,
    scaled_scores,
    tokens_shape,
    unpack,
    visible,
    weighted_dot,
    write_forward,
)
from freeatten_jax.attention.pallas.tpu_schedule import Causal, Schedule, every_block, locate
from freeatten_jax.attention.rules import FAMILIES, log2_1p_eup

EUP_MATH = dict(log2_1p=log2_1p_eup)  # the elementwise maths the TPU kernels' families run


class Tuning(NamedTuple):
    """Per TPU generation: default (block_q, block_k) and the scoped VMEM limit the kernels ask for."""

    blocks: tuple[int, int]
    vmem_limit_bytes: int


MIB = 2**20
# device_kind fragment -> tuning; the first that matches wins, "" matches any TPU. Chosen by compiling
# without the chips (benchmarks/RESULTS.md): at 512 x 512 every variant's kernels fit the default 16M
# scope (1024 x 1024 needs 25M for LSSAR's forward); the limit leaves headroom below the physical VMEM
# (128M on v5e and v6e, 64M on v5p). Not timed on a device: benchmarks/device_check.py sweeps them.
TUNING = {
    "v6 lite": Tuning((512, 512), 64 * MIB),
    "v5 lite": Tuning((512, 512), 64 * MIB),
    "v5": Tuning((512, 512), 48 * MIB),
    "": Tuning((512, 512), 16 * MIB),
}


def tuning() -> Tuning:
    """The TUNING entry of the TPU being compiled for: the ambient mesh's device kind, else this host's."""
    kind = jax.sharding.get_abstract_mesh().abstract_device
    kind = kind.device_kind if kind is not None and kind.platform == "tpu" else None
    if kind is None and jax.default_backend() == "tpu":
        kind = jax.devices()[0].device_kind
    kind = (kind or "").lower()
    return next(entry for fragment, entry in TUNING.items() if fragment in kind)


def _clamp(x, first, end):
    """x moved into [first, end - 1] (first when the span is empty): a skipped step refetches nothing."""
    return jnp.minimum(jnp.maximum(x, first), jnp.maximum(end - 1, first))


def _store(refs, tree):
    for ref, x in zip(refs, jax.tree.leaves(tree)):
        ref[...] = x


def _held_block(cfg: Static, x: KernelRefs, masked: bool, with_values: bool):
    """(scores, mask, values) of the key block a grid step holds; masked: with its mask, hidden keys zeroed."""
    k, v, vis = unpack(cfg, x.k[...]), unpack(cfg, x.v[...]) if with_values else None, None
    if masked:
        vis, seen = key_block(cfg, [x.kv_mask[m] for m in range(3)], (x.q_mask[0], x.q_mask[1]))
        k = jnp.where(seen, k, 0)
        v = None if v is None else jnp.where(seen, v, 0)
    return scaled_scores(unpack(cfg, x.q[...]), k, column(x.qs[...]), key_factor(cfg, x.ks, ...)), vis, v


def _visits(spans: Spans, step):
    """Whether a step's inner block is interior (every pair visible: no mask) and whether it is visited with a mask."""
    b, i, j = pl.program_id(0), step.outer, step.inner
    interior = (spans.full[0, b, i] <= j) & (j < spans.full[1, b, i]) & step.valid
    return interior, (spans.first[b, i] <= j) & (j < spans.end[b, i]) & step.valid & ~interior


def _step(schedule: Schedule):
    """The schedule's step (tpu_schedule.locate) of this grid step (b, heads, r, t)."""
    return locate(schedule, pl.program_id(2), pl.program_id(3))


def kernel_schedule(cfg: Static, outer: int, inner: int, passes: int = 1, minor: int = 1, key_major: bool = False) -> Schedule:
    """A kernel's schedule over `outer` blocks: the causal spans under a plain causal mask, else every inner block."""
    if not (cfg.causal and cfg.plain_length):
        return every_block(outer, inner, passes, minor)
    blocks = (cfg.blocks.k, cfg.blocks.q) if key_major else (cfg.blocks.q, cfg.blocks.k)
    return Schedule(outer, inner, passes, minor, Causal(cfg.plain_length, *blocks, key_major))


def forward_kernel(cfg: Static, schedule: Schedule, spans: Spans, x: KernelRefs, *refs):
    """One grid step (b, h, r, t): a key block of one pass for one query block (tpu_schedule.locate). Each pass's
    `finish` runs once, at its last step, under its own `pl.when` (Mosaic does not move a computation into the
    branch that uses it: LSSAR's first finish cost ~1,200 bundles on every step): an earlier pass's row
    statistics wait in scratch for the next pass's steps, and the last pass's output and statistics are written
    at the last step."""
    step, passes = _step(schedule), schedule.passes
    now = step.which
    interior, masked = _visits(spans, step)
    family = kernel_family(cfg)
    outputs = 1 + len(family.stats) + len(family.extras) + low_half(cfg)
    out_refs, slots = refs[:outputs], iter(refs[outputs:])
    ctx, row_refs, d = kernel_ctx(cfg, x.n[...], x.p[0], EUP_MATH), dict[str, Any](), x.q.shape[-1] // cfg.pack
    load_rows = lambda: {name: ref[...] for name, ref in row_refs.items()}  # noqa: E731
    for which, (one, (carried, finished)) in enumerate(zip(family.passes, forward_scratch(cfg, d))):
        leaves, tree = jax.tree.flatten(fresh_carry(one, cfg.blocks.q, d))
        carry_refs = [next(slots) for _ in carried]
        load = functools.partial(lambda refs, tree: jax.tree.unflatten(tree, [ref[...] for ref in refs]), carry_refs, tree)
        pl.when((now == which) & step.first)(functools.partial(_store, carry_refs, leaves))

        def visit(one, carry_refs, load, is_masked):
            _store(carry_refs, one.step(load(), *_held_block(cfg, x, is_masked, one.with_values), ctx, load_rows()))

        for when, is_masked in ((masked, True), (interior, False)):
            pl.when((now == which) & when)(functools.partial(visit, one, carry_refs, load, is_masked))
        if which < passes - 1:
            names = list(finished)
            new_refs = [next(slots) for _ in names]

            def finish(one, load, new_refs):
                _store(new_refs, [value for _, value in sorted(one.finish(load(), ctx)[1].items())])

            pl.when((now == which) & step.last)(functools.partial(finish, one, load, new_refs))
            row_refs |= dict(zip(names, new_refs))
        else:

            def write(one, load):
                out, new = one.finish(load(), ctx)
                write_forward(cfg, family, out_refs, out, {**load_rows(), **new})

            pl.when((now == which) & step.last)(functools.partial(write, one, load))


def finished_rows(cfg: Static, which: int, d: int) -> dict:
    """{name: shape} of the row statistics pass `which` finishes with (sorted by name), for a [Q, D] block."""
    one, q = kernel_family(cfg).passes[which], cfg.blocks.q
    ctx = kernel_ctx(cfg, jnp.zeros((q, 1), jnp.float32), jnp.zeros((), jnp.float32), EUP_MATH)
    rows = jax.eval_shape(lambda c: one.finish(c, ctx)[1], fresh_carry(one, q, d))
    return {name: rows[name].shape for name in sorted(rows)}


def forward_scratch(cfg: Static, d: int) -> list[tuple[list[tuple[int, int]], dict]]:
    """The forward kernel's VMEM scratch, pass by pass, in the order it takes the refs: the [Q, width] carry leaves,
    then (every pass but the last) the row statistics it finishes with, {name: shape} (finished_rows)."""
    passes = len(kernel_family(cfg).passes)
    return [
        ([(cfg.blocks.q, w) for w in carry_widths(cfg, which, d)], finished_rows(cfg, which, d) if which < passes - 1 else {})
        for which in range(passes)
    ]


def dq_scratch(cfg: Static, d: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The dq kernel's VMEM scratch: its accumulators (dq [Q, D], and the rows' dL/dp [Q, 1] if cfg.p_grad, one per
    output), then the family's backward rows as [Q, 1] columns."""
    q = cfg.blocks.q
    return [(q, d), (q, 1)][: 1 + cfg.p_grad], [(q, 1)] * len(FAMILIES[cfg.family].rows)


def pass_kernel(cfg: Static, which: int, row_names, schedule: Schedule, spans: Spans, x: KernelRefs, *refs):
    """One grid step (b, h, r, t): pass `which` of the family continued from a carry over a key block of a ring
    step's chunk (ring.py). The carry (row statistics lane-dense, [1, Q]) is read into VMEM scratch at the query
    block's first step (the ring's first step, given no carry, starts it from the family's init), accumulated there
    and written out at its last."""
    step = _step(schedule)
    one = kernel_family(cfg).passes[which]
    interior, masked = _visits(spans, step)
    leaves, tree = jax.tree.flatten(fresh_carry(one, 1, 1))
    out_refs, acc_refs = refs[: len(leaves)], refs[len(leaves) :]
    load = lambda: jax.tree.unflatten(tree, [ref[...] for ref in acc_refs])  # noqa: E731

    @pl.when(step.first)
    def _():
        fresh = fresh_carry(one, cfg.blocks.q, x.q.shape[-1] // cfg.pack)
        _store(acc_refs, [carry_in(cfg, ref[...]) for ref in x.carry] if x.carry else jax.tree.leaves(fresh))

    def visit(is_masked: bool):
        rows = {name: column(ref[...]) for name, ref in zip(row_names, x.rows)}
        ctx = kernel_ctx(cfg, x.n[...], x.p[0], EUP_MATH)
        _store(acc_refs, one.step(load(), *_held_block(cfg, x, is_masked, one.with_values), ctx, rows))

    pl.when(masked)(functools.partial(visit, True))
    pl.when(interior)(functools.partial(visit, False))

    @pl.when(step.last)
    def _():
        _store(out_refs, [carry_out(cfg, ref[...]) for ref in acc_refs])


def dq_kernel(cfg: Static, schedule: Schedule, spans: Spans, x: KernelRefs, *refs):
    """One grid step (b, h, r, t): adds a key block j's share of Σ_j ds_ij b_j k_j (and of the rows' dL/dp if
    cfg.p_grad, written as a [1, Q] row); written at the query block's last step. The rows come lane-dense, as [1, Q]."""
    step = _step(schedule)
    family = FAMILIES[cfg.family]
    accumulators = dq_scratch(cfg, x.q.shape[-1] // cfg.pack)[0]
    out_refs, acc_refs, column_refs = (
        refs[: len(accumulators)],
        refs[len(accumulators) : 2 * len(accumulators)],
        refs[2 * len(accumulators) :],
    )

    @pl.when(step.first)
    def _():
        for ref in acc_refs:
            ref[...] = jnp.zeros(ref.shape, jnp.float32)
        for ref, lane_dense in zip(column_refs, x.rows):  # each row [1, Q] in HBM, a column once per query block
            ref[...] = column(lane_dense[...])

    def add(masked: bool):
        rows = {name: ref[...] for name, ref in zip(family.rows, column_refs)}
        ctx = kernel_ctx(cfg, x.n[...], x.p[0], EUP_MATH)
        k, vis = unpack(cfg, x.k[...]), None
        if masked:
            vis, seen = key_block(cfg, [x.kv_mask[m] for m in range(3)], (x.q_mask[0], x.q_mask[1]))
            k = jnp.where(seen, k, 0)
        ks = key_factor(cfg, x.ks, ...)
        q, dout, v = (unpack(cfg, ref[...]) for ref in (x.q, x.dout, x.v))
        args = (scaled_scores(q, k, column(x.qs[...]), ks), vis, ctx, rows, dot(dout, v, NT))
        _, ds = family.grad(*args)
        acc_refs[0][...] = weighted_dot(cfg.split, ds if ks is None else ds * ks, k, acc_refs[0][...])
        if cfg.p_grad and family.power_grad is not None:
            acc_refs[1][...] += jnp.sum(family.power_grad(*args), axis=1, keepdims=True)

    interior, masked = _visits(spans, step)
    pl.when(masked)(functools.partial(add, True))
    pl.when(interior)(functools.partial(add, False))

    @pl.when(step.last)
    def _():
        out_refs[0][...] = pack(cfg, acc_refs[0][...])
        if cfg.p_grad:
            out_refs[1][...] = row(acc_refs[1][...])


def dkv_kernel(cfg: Static, schedule: Schedule, spans: Spans, x: KernelRefs, dk_ref, dv_ref, dk_acc, dv_acc):
    """One grid step (b, kv head, r, t): adds a query block i of one head of the group to Σ_i ds_ij a_i q_i and
    dv (key-major [C, Q] blocks, as gpu.dkv_kernel); written at the key block's last step."""
    step = _step(schedule)
    family = FAMILIES[cfg.family]

    @pl.when(step.first)
    def _():
        dk_acc[...] = jnp.zeros(dk_acc.shape, jnp.float32)
        dv_acc[...] = jnp.zeros(dv_acc.shape, jnp.float32)

    def add(masked: bool):
        (q, dout, k, v), qs = (unpack(cfg, ref[...]) for ref in (x.q, x.dout, x.k, x.v)), x.qs[...]
        rows = {name: ref[...] for name, ref in zip(family.rows, x.rows)}  # each [1, Q]
        vis_t = visible(cfg, x.q_mask[0], x.q_mask[1], *[x.kv_mask[m] for m in range(3)]) if masked else None
        ctx = kernel_ctx(cfg, x.n[...], x.p[0], EUP_MATH)
        s_t = scaled_scores(k, q, column(x.ks[...]) if cfg.key_scale else None, qs)
        w_t, ds_t = family.grad(s_t, vis_t, ctx, rows, dot(v, dout, NT))
        dk_acc[...] = weighted_dot(cfg.split, ds_t * qs, q, dk_acc[...])
        dv_acc[...] = weighted_dot(cfg.split, w_t, dout, dv_acc[...])

    interior, masked = _visits(spans, step)
    pl.when(masked)(functools.partial(add, True))
    pl.when(interior)(functools.partial(add, False))

    @pl.when(step.last)
    def _():
        dk_ref[...], dv_ref[...] = pack(cfg, dk_acc[...]), pack(cfg, dv_acc[...])


def _common(interpret: bool):
    """The pallas_call arguments every TPU kernel shares: grid semantics (the last axis carries) and the VMEM limit."""
    params = pltpu.CompilerParams(
        dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"), vmem_limit_bytes=tuning().vmem_limit_bytes
    )
    return dict(interpret=interpret, compiler_params=params)


def _tokens(cfg: Static, block: int, d: int) -> tuple:
    """The block shape of a [B, heads, L, D] array, packed in HBM (common.tokens_shape), one block of `block` tokens."""
    return (None, *tokens_shape(cfg, None, block, d))


def _query_major_specs(cfg: Static, shapes, schedule: Schedule, values_from: int = 0):
    """The forward, dq and pass kernels' input specs on the grid (b, h, r, t) of a schedule (the key block clamped
    into the visiting span, which a static span is already), and the specs of a [Q, D] block and a lane-dense
    [1, Q] row. V is read from pass `values_from` on: before it (LSSAR's first pass) its index stays
    on the first block of the query block's span, the one the first pass that reads it starts with, so it is
    fetched once."""
    (b, h, tp, d), (kv_heads, sp) = shapes
    (block_q, block_k, _), g = cfg.blocks, cfg.kv_groups

    def query_index(r, t):
        return locate(schedule, r, t).outer

    def key_index(b, r, t, spans: Spans):
        step = locate(schedule, r, t)
        return _clamp(step.inner, spans.first[b, step.outer], spans.end[b, step.outer]) if schedule.causal is None else step.inner

    def value_index(b, r, t, spans: Spans):
        step = locate(schedule, r, t)
        return jnp.where(step.which < values_from, spans.first[b, step.outer], key_index(b, r, t, spans))

    q_spec = pl.BlockSpec(_tokens(cfg, block_q, d), lambda b, h, r, t, _: (b, h, query_index(r, t), 0))
    lane_dense = pl.BlockSpec((None, None, None, 1, block_q), lambda b, h, r, t, _: (b, h, query_index(r, t), 0, 0))
    specs = KernelRefs(
        p=pl.BlockSpec(memory_space=pltpu.SMEM),
        q=q_spec,
        k=pl.BlockSpec(_tokens(cfg, block_k, d), lambda b, h, r, t, s: (b, jax.lax.div(h, g), key_index(b, r, t, s), 0)),
        v=pl.BlockSpec(_tokens(cfg, block_k, d), lambda b, h, r, t, s: (b, jax.lax.div(h, g), value_index(b, r, t, s), 0)),
        qs=lane_dense,
        ks=pl.BlockSpec(
            (None, None, None, 1, block_k), lambda b, h, r, t, s: (b, jax.lax.div(h, g), key_index(b, r, t, s), 0, 0)
        ),
        q_mask=pl.BlockSpec((2, None, block_q, 1), lambda b, h, r, t, _: (0, b, query_index(r, t), 0)),
        kv_mask=pl.BlockSpec((3, None, None, 1, block_k), lambda b, h, r, t, s: (0, b, key_index(b, r, t, s), 0, 0)),
        n=pl.BlockSpec((None, block_q, 1), lambda b, h, r, t, _: (b, query_index(r, t), 0)),
    )
    return specs, q_spec, lane_dense


def _grid_spec(shapes_bh, schedule: Schedule, in_specs: KernelRefs, **specs):
    """The grid spec of a kernel on grid (b, heads, R, L), called as call(spans, KernelRefs): the spans as scalar
    prefetch."""
    grid = (*shapes_bh, schedule.rows, schedule.steps)
    return pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=grid, in_specs=(in_specs,), **specs)


def pass_call(cfg: Static, shapes, which: int, row_names, fresh: bool, interpret: bool):
    """The pass kernel's pallas_call (every key block of the ring step's chunk, for each query block): the
    forward's inputs, the earlier passes' rows and the carry in (fresh: none, the ring's first step); the carry
    out (aliasing the carry in)."""
    (b, h, tp, d), (_, sp) = shapes
    schedule = every_block(tp // cfg.blocks.q, sp // cfg.blocks.k)
    with_values = kernel_family(cfg).passes[which].with_values
    specs, q_spec, lane_dense = _query_major_specs(cfg, shapes, schedule, 0 if with_values else 1)
    carries = carry_shapes(cfg, shapes, which)
    carry_specs = tuple(lane_dense if len(x.shape) == 5 else q_spec for x in carries)
    specs = specs._replace(rows=(lane_dense,) * len(row_names), carry=() if fresh else carry_specs)
    scratch = [pltpu.VMEM((cfg.blocks.q, w), jnp.float32) for w in carry_widths(cfg, which, d)]
    return pl.pallas_call(
        functools.partial(pass_kernel, cfg, which, tuple(row_names), schedule),
        grid_spec=_grid_spec((b, h), schedule, specs, out_specs=list(carry_specs), scratch_shapes=scratch),
        out_shape=carries,
        input_output_aliases={} if fresh else {first_carry((Spans(0, 0, 0), specs)) + x: x for x in range(len(carries))},
        name=f"freeatten_{cfg.family}_pass{which}",
        **_common(interpret),
    )


def calls(cfg: Static, shapes, interpret: bool):
    """The three pallas_calls (forward, dq, dkv) for arrays of the given padded shapes, each called as
    call(spans, KernelRefs), as the GPU ones."""
    (b, h, tp, d), (kv_heads, sp) = shapes
    (block_q, block_k, _), g = cfg.blocks, cfg.kv_groups
    q_blocks, k_blocks = tp // block_q, sp // block_k
    family, forward_family, f32 = FAMILIES[cfg.family], kernel_family(cfg), jnp.float32
    common = _common(interpret)
    passes = len(forward_family.passes)
    forward_schedule, dq_schedule = kernel_schedule(cfg, q_blocks, k_blocks, passes), kernel_schedule(cfg, q_blocks, k_blocks)
    specs, q_spec, lane_dense = _query_major_specs(cfg, shapes, dq_schedule)
    first_valued = [one.with_values for one in forward_family.passes].index(True)  # LSSAR's first pass reads no V
    forward_specs, forward_q, forward_rows = _query_major_specs(cfg, shapes, forward_schedule, first_valued)
    out_specs, out_shape = forward_outputs(cfg, shapes, forward_q, forward_rows)
    forward = pl.pallas_call(
        functools.partial(forward_kernel, cfg, forward_schedule),
        grid_spec=_grid_spec(
            (b, h),
            forward_schedule,
            forward_specs,
            out_specs=out_specs,
            scratch_shapes=[
                pltpu.VMEM(shape, f32) for carry, finished in forward_scratch(cfg, d) for shape in carry + list(finished.values())
            ],
        ),
        out_shape=out_shape,
        name=f"freeatten_{cfg.family}_fwd",
        **common,
    )
    dq_specs, dq_shape = dq_outputs(cfg, shapes, q_spec, lane_dense)
    dq = pl.pallas_call(
        functools.partial(dq_kernel, cfg, dq_schedule),
        grid_spec=_grid_spec(
            (b, h),
            dq_schedule,
            specs._replace(dout=q_spec, rows=(lane_dense,) * len(family.rows)),
            out_specs=dq_specs,
            scratch_shapes=[pltpu.VMEM(shape, f32) for shape in sum(dq_scratch(cfg, d), [])],
        ),
        out_shape=dq_shape,
        name=f"freeatten_{cfg.family}_dq",
        **common,
    )

    # dkv: grid (b, kv head, r, t), key block `outer`, query block `inner` clamped into the span, head `minor` of the group
    dkv_schedule = kernel_schedule(cfg, k_blocks, q_blocks, minor=g, key_major=True)

    def at(r, t):
        return locate(dkv_schedule, r, t)

    def query_index(b, r, t, spans: Spans):
        step = at(r, t)
        return (
            _clamp(step.inner, spans.first[b, step.outer], spans.end[b, step.outer])
            if dkv_schedule.causal is None
            else step.inner
        )

    def head(k, r, t):
        return k * g + at(r, t).minor

    group_spec = pl.BlockSpec(_tokens(cfg, block_q, d), lambda b, k, r, t, s: (b, head(k, r, t), query_index(b, r, t, s), 0))
    group_rows = pl.BlockSpec(
        (None, None, None, 1, block_q), lambda b, k, r, t, s: (b, head(k, r, t), query_index(b, r, t, s), 0, 0)
    )
    k_spec = pl.BlockSpec(_tokens(cfg, block_k, d), lambda b, k, r, t, _: (b, k, at(r, t).outer, 0))
    dkv_specs = KernelRefs(
        p=pl.BlockSpec(memory_space=pltpu.SMEM),
        q=group_spec,
        k=k_spec,
        v=k_spec,
        qs=group_rows,
        ks=pl.BlockSpec((None, None, None, 1, block_k), lambda b, k, r, t, _: (b, k, at(r, t).outer, 0, 0)),
        q_mask=pl.BlockSpec((2, None, None, 1, block_q), lambda b, k, r, t, s: (0, b, query_index(b, r, t, s), 0, 0)),
        kv_mask=pl.BlockSpec((3, None, block_k, 1), lambda b, k, r, t, _: (0, b, at(r, t).outer, 0)),
        n=pl.BlockSpec((None, None, 1, block_q), lambda b, k, r, t, s: (b, query_index(b, r, t, s), 0, 0)),
        dout=group_spec,
        rows=(group_rows,) * len(family.rows),
    )
    dkv = pl.pallas_call(
        functools.partial(dkv_kernel, cfg, dkv_schedule),
        grid_spec=_grid_spec(
            (b, kv_heads),
            dkv_schedule,
            dkv_specs,
            out_specs=[k_spec, k_spec],
            scratch_shapes=[pltpu.VMEM((block_k, d), f32)] * 2,
        ),
        out_shape=[jax.ShapeDtypeStruct(tokens_shape(cfg, b, kv_heads, sp, d), f32)] * 2,
        name=f"freeatten_{cfg.family}_dkv",
        **common,
    )
    return forward, dq, dkv
