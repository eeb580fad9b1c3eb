"""What the GPU (gpu.py) and TPU (tpu.py) kernels share: their inputs by name, their trace-time constants, the
matmuls, the mask of a block and the layouts of row statistics. The families' maths is rules.FAMILIES.

Glossary: Q / C query / key block length, D head dim. In a kernel every array is 2-D: scores s, mask vis,
weights w, ds are [Q, C] (key-major [C, Q] in the dK/dV kernels, where row statistics come as [1, Q] rows;
the family maths is elementwise, so it serves both); row statistics [Q, 1]; blocks of q, k, v, out [Q|C, D].
In HBM a TPU lays [.., L, D] out in rows of 128 lanes: with D = 64 each row is half padding. There (Static.pack
f > 1) the kernels' [.., L, D] arrays travel packed, [.., L / f, f D], each block of L tokens interleaved so
that packed row r holds the block's tokens r, r + L / f, ... (core.packed); a kernel unpacks a block it reads
and packs one it writes (unpack, pack).
"""

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from freeatten_jax.attention.rules import FAMILIES, Ctx, Family, Pass, output_only

NT = (((1,), (1,)), ((), ()))  # a [M, D] x b [N, D] -> [M, N]
NN = (((1,), (0,)), ((), ()))  # a [M, N] x b [N, D] -> [M, D]


class BlockSizes(NamedTuple):
    """The kernels' block lengths: queries and keys of the forward and dQ kernels; k_dkv the dK/dV kernel's key
    block, a divisor of k (None: k). The TPU dK/dV kernel runs key blocks of k (its accumulators live in VMEM)."""

    q: int
    k: int
    k_dkv: int | None = None


class Static(NamedTuple):
    """Trace-time constants of a kernel, the same on every platform."""

    family: str
    causal: bool
    window: int | None
    blocks: BlockSizes
    kv_groups: int  # G
    static_power: int | None
    weight: Callable | None
    dtype: Any  # the inputs' dtype: the matmul operands and the output
    p_grad: bool  # the dq kernel also gives each row's share of dL/dp (LSSAR with an array p)
    key_scale: bool  # the scores carry a per-key factor b_j (LSSA, LSSAR); the per-query a_i always
    split: bool  # the weights and ds enter their matmuls as two halves (weighted_dot)
    plain_length: int | None = None  # T (= S) of a plain mask (Mask.plain): its causal block spans known when tracing
    residuals: bool = True  # the forward also writes what the backward reads (statistics, extras, the low half)
    pack: int = 1  # tokens per row of the [.., L, D] arrays in HBM (f, above): 128 // D on a TPU with D < 128


class Spans(NamedTuple):
    """Which inner blocks a kernel visits for each (batch row, outer block), from plan.Plan: [first, end) and the
    run of interior (wholly visible) ones. The TPU kernels take them as scalar prefetch: their index maps read them."""

    first: Any  # [B, X] int32
    end: Any  # [B, X]
    full: Any  # [2, B, X]


class KernelRefs(NamedTuple):
    """Every kernel's inputs by name: the one order in which they are passed, specified (BlockSpecs) and bound to
    refs (Pallas binds by position). Masks and N_i come as columns in the query-major kernels (forward, dq, pass) and
    as rows in the key-major dK/dV kernel (plan.Plan)."""

    p: Any  # [1] float32, LSSAR's p (0 without)
    q: Any
    k: Any
    v: Any
    qs: Any  # the query factors a_i, lane-dense [1, Q] rows
    ks: Any  # the key factors b_j, lane-dense [1, C] rows (read only with Static.key_scale)
    q_mask: Any  # query positions and segment ids
    kv_mask: Any  # key positions, segment ids and validity (0/1)
    n: Any  # N_i, float32
    dout: Any = None  # the backward kernels: dL/d out
    rows: tuple = ()  # the backward's row terms (family.rows), or a pass kernel's earlier passes' row statistics
    carry: tuple = ()  # a pass kernel's carry in (aliased to its carry out)


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


def halves(split: bool, w, dtype) -> list:
    """w (float32: weights or ds) as a matmul on the tensor cores takes it: rounded to `dtype`, or with `split` (and
    dtype not float32) as two halves in dtype, [lo, hi] with w = hi + lo: as exact as float32 w (error ~2^-17 of w
    instead of bfloat16's 2^-9) for one more matmul."""
    hi = w.astype(dtype)
    return [(w - hi.astype(jnp.float32)).astype(dtype), hi] if split and dtype != jnp.float32 else [hi]


def weighted_dot(split: bool, w, x, acc):
    """acc + w @ x, w in halves(split) on the tensor cores, accumulated in float32. Each matmul's sum is `dot + acc`,
    the form Triton folds into the matmul's own accumulator (acc + (hi + lo) cost two float32 adds per element)."""
    for part in halves(split, w, x.dtype):
        acc = dot(part, x, NN) + acc
    return acc


def kernel_family(cfg: Static) -> Family:
    """The family the forward kernels run: the whole one, or its output passes alone when no gradient follows."""
    return FAMILIES[cfg.family] if cfg.residuals else output_only(FAMILIES[cfg.family])


def kernel_ctx(cfg: Static, n, p, fast: dict[str, Callable] | None = None) -> Ctx:
    """The family's context for a block: N_i, p, and the platform's `fast` elementwise maths (rules.Ctx's fields)."""
    pv, pv_once = functools.partial(weighted_dot, cfg.split), functools.partial(weighted_dot, False)
    return Ctx(n=n, p=p, static_power=cfg.static_power, weight=cfg.weight, pv=pv, pv_once=pv_once, **(fast or {}))


def visible(cfg: Static, q_pos, q_seg, k_pos, k_seg, k_valid):
    """M for a column of one side against a row of the other ([Q, C] or key-major [C, Q]): same
    segment, valid key, causal and window. Arguments are int32; k_valid is 0/1."""
    vis = (q_seg == k_seg) & (k_valid > 0)
    if cfg.causal:
        vis &= k_pos <= q_pos
    if cfg.window is not None:
        vis &= jnp.abs(q_pos - k_pos) < cfg.window
    return vis


def key_block(cfg: Static, key_rows, q_col):
    """The [Q, C] mask of a key block (its positions, segments, validity as [1, C] rows), and the [C, 1]
    keys that no query of the block sees (the row of per-key maxima turned into a column)."""
    vis = visible(cfg, *q_col, *key_rows)
    return vis, column(jnp.max(vis.astype(jnp.float32), axis=0, keepdims=True)) > 0


def key_factor(cfg: Static, ks_ref, index):
    """Key block `index`'s factors b_j as a [1, C] row (index `...`: the block a TPU grid step holds), or None
    without a key factor."""
    return ks_ref[index] if cfg.key_scale else None


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


def write_forward(cfg: Static, family: Family, out_refs, out, stats):
    """The output's halves (split_output) and the family's statistics (each row statistic lane-dense, as a row)."""
    hi, lo = split_output(cfg, out)
    out_refs[0][...] = pack(cfg, hi)
    for ref, name in zip(out_refs[1:], family.stats + family.extras):
        ref[...] = row(stats[name]) if name in family.stats else pack(cfg, stats[name])
    if lo is not None:
        out_refs[-1][...] = pack(cfg, lo)


def unpack(cfg: Static, x):
    """A block as read from HBM, [L / f, f D] (Static.pack f), as the kernel computes with it, [L, D]."""
    d = x.shape[1] // cfg.pack
    return x if cfg.pack == 1 else jnp.concatenate([x[:, j * d : (j + 1) * d] for j in range(cfg.pack)], axis=0)


def pack(cfg: Static, x):
    """A [L, D] block as written to HBM, [L / f, f D] (unpack's inverse)."""
    rows = x.shape[0] // cfg.pack
    return x if cfg.pack == 1 else jnp.concatenate([x[j * rows : (j + 1) * rows] for j in range(cfg.pack)], axis=1)


def tokens_shape(cfg: Static, *leading_length_d) -> tuple[int, ...]:
    """The HBM shape of a [.., L, D] array of the kernels: [.., L / f, f D] (Static.pack f)."""
    *leading, length, d = leading_length_d
    return (*leading, length // cfg.pack, d * cfg.pack)


def carry_in(cfg: Static, x):
    """A pass kernel's carry leaf as read ([1, Q]: a row statistic, lane-dense in HBM; else a packed accumulator) as
    the family holds it ([Q, 1] or [Q, D])."""
    return column(x) if x.shape[0] == 1 else unpack(cfg, x)


def carry_out(cfg: Static, x):
    """A carry leaf as the family holds it, as written: a row statistic [Q, 1] (width 1, carry_widths) as a [1, Q] row,
    an accumulator packed."""
    return row(x) if x.shape[1] == 1 else pack(cfg, x)


def fresh_carry(one: Pass, q: int, d: int):
    """Pass `one`'s carry before any key block, for q rows of head dim d: its init on float32 zeros."""
    return one.init(jnp.zeros((q, 1), jnp.float32), jnp.zeros((q, d), jnp.float32))


def carry_widths(cfg: Static, which: int, d: int) -> list[int]:
    """The last-axis widths of pass `which`'s carry leaves: 1 for a [Q, 1] row statistic, D for an accumulator."""
    return [x.shape[-1] for x in jax.tree.leaves(fresh_carry(kernel_family(cfg).passes[which], 1, d))]


def forward_outputs(cfg: Static, shapes, block_spec, row_spec) -> tuple[list, list]:
    """The forward kernel's (out_specs, out_shape): the output [B, H, Tp, D] in the input dtype, the family's row
    statistics as lane-dense rows [B, H, I, 1, Q], its float32 extras and (low_half) the output's low half ([.., Tp,
    D] arrays packed: tokens_shape)."""
    (b, h, tp, d), _ = shapes
    family, f32 = kernel_family(cfg), jnp.float32
    out = jax.ShapeDtypeStruct(tokens_shape(cfg, b, h, tp, d), cfg.dtype)
    stats = [jax.ShapeDtypeStruct((b, h, tp // cfg.blocks.q, 1, cfg.blocks.q), f32)] * len(family.stats)
    extras = [jax.ShapeDtypeStruct(tokens_shape(cfg, b, h, tp, d), f32)] * len(family.extras) + [out] * low_half(cfg)
    return [block_spec] + [row_spec] * len(stats) + [block_spec] * len(extras), [out, *stats, *extras]


def dq_outputs(cfg: Static, shapes, block_spec, row_spec) -> tuple[list, list]:
    """The dq kernel's (out_specs, out_shape): Σ_j ds_ij b_j k_j [B, H, Tp, D] float32 and, with cfg.p_grad, the
    rows' shares of dL/dp as lane-dense rows [B, H, I, 1, Q] (the sums packed: tokens_shape)."""
    (b, h, tp, d), _ = shapes
    sums = jax.ShapeDtypeStruct(tokens_shape(cfg, b, h, tp, d), jnp.float32)
    powers = jax.ShapeDtypeStruct((b, h, tp // cfg.blocks.q, 1, cfg.blocks.q), jnp.float32)
    return [block_spec, row_spec][: 1 + cfg.p_grad], [sums, powers][: 1 + cfg.p_grad]


def carry_shapes(cfg: Static, shapes, which: int) -> list:
    """Pass `which`'s carry leaves in HBM: row statistics lane-dense [B, H, I, 1, Q] (a [B, H, Tp, 1] float32 array
    is padded 128x on a TPU), accumulators [B, H, Tp, D] packed (tokens_shape); float32."""
    (b, h, tp, d), _ = shapes
    q = cfg.blocks.q
    return [
        jax.ShapeDtypeStruct((b, h, tp // q, 1, q) if w == 1 else tokens_shape(cfg, b, h, tp, w), jnp.float32)
        for w in carry_widths(cfg, which, d)
    ]


def first_carry(args) -> int:
    """The flat input index of a pass call's first carry leaf (its `input_output_aliases`): the carry comes last."""
    *_, x = args
    return len(jax.tree.leaves(args)) - len(x.carry)
