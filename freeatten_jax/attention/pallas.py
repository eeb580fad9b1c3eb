"""implementation="pallas": fused kernels for every variant (docs/method.md §3), forward and backward.

Glossary: B batch, T queries, S keys, H heads, K kv heads, G = H // K, D head dim, Tp / Sp lengths
padded to whole blocks. The kernels take q and k as given (in the input dtype: bfloat16 is rounded once, not
again after normalising) and the variant's float32 factors of the scores apart (`scales`, outside the kernels,
so autodiff carries their gradients, e.g. to SSMax's s and b); statistics are float32. A custom VJP
saves only the output and per-row statistics (without a gradient the forward kernel writes the output alone:
rules.output_only); the backward recomputes scores in a dQ kernel (per query block) and a key-major dK/dV
kernel (per key block, summing the G query heads: no repeated K/V).
On GPU the forward and dQ kernels read a head's whole K and V and loop over its visible key blocks;
on TPU (pallas_tpu.py) the grid streams them one block at a time through VMEM.
Per platform (LOWERINGS): Triton on CUDA, Mosaic on TPU, Pallas interpret mode on CPU (or anywhere
with interpret=True, or "tpu" for the TPU kernels); chosen with jax.lax.platform_dependent, so
cross-platform lowering is right.
Inside a mesh (the ambient one, `jax.set_mesh`) the kernels run in `shard_map`, each device on its
shard: the SPMD partitioner cannot split a Pallas call (Mosaic refuses; Triton calls get replicated).
"""

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

from freeatten_jax.attention import pallas_plan, pallas_tpu
from freeatten_jax.attention.blockwise import count_visible, static_power
from freeatten_jax.attention.pallas_kernels import (
    Static,
    carry_widths,
    dkv_kernel,
    dkv_split,
    dq_kernel,
    forward_kernel,
    kernel_family,
    low_half,
    pass_kernel,
)
from freeatten_jax.attention.rules import FAMILIES
from freeatten_jax.attention.variants import Mask, Variant, check_positive_int, hide_unseen

# Mesh axes that shard the batch and the heads when present (sized > 1) and dividing them: the names of
# freeatten_jax.nn.sharding's mesh; `batch_axes=` / `head_axes=` name others. Other axes replicate.
BATCH_AXES = ("data", "fsdp")
HEAD_AXES = ("tensor",)


class Lowering(NamedTuple):
    """How one platform compiles the kernels."""

    blocks: Callable[[str], tuple[int, int]]  # blocks(family) -> default (block_q, block_k)
    min_block: int
    power_of_two: bool  # block lengths must be powers of two (Triton, Mosaic)
    calls: Callable  # calls(cfg, shapes) -> the (forward, dq, dkv) pallas_calls
    pass_call: Callable  # pass_call(cfg, shapes, which, row_names) -> one forward pass from a carry (ring_kernels.py)


TRITON_WARPS = 4


def _triton_params():
    from jax.experimental.pallas import triton as pltriton

    return pltriton.CompilerParams(num_warps=TRITON_WARPS, num_stages=2)


def _gpu(ptx: bool, interpret: bool):
    """The GPU kernels' (calls, pass_call) builders: compiled by Triton (inline PTX) or run in interpret mode."""
    params = lambda: None if interpret else _triton_params()  # noqa: E731
    fix = lambda cfg: cfg._replace(ptx=ptx)  # noqa: E731
    return dict(
        calls=lambda cfg, shapes: _calls(fix(cfg), shapes, params(), interpret),
        pass_call=lambda cfg, shapes, which, rows: _pass_call(fix(cfg), shapes, which, rows, params(), interpret),
    )


def _tpu(interpret: bool):
    """The TPU kernels' (calls, pass_call) builders: compiled by Mosaic or run in interpret mode."""
    return dict(
        calls=functools.partial(pallas_tpu.calls, interpret=interpret),
        pass_call=functools.partial(pallas_tpu.pass_call, interpret=interpret),
    )


# The GPU blocks (block_q, block_k) per family, from the device check's sweep (benchmarks/RESULTS.md, H200, T = 8K,
# fwd+bwd): LSSAR 8.3 ms at 64 x 32 against 10.8 at 64 x 64 (its dK/dV accumulators spill at 64 keys); softmax and
# LSSA fastest at 64 x 64 (4.1 and 6.2 ms).
GPU_BLOCKS = {"reweight": (64, 32)}
GPU_DEFAULT_BLOCKS = (64, 64)
LOWERINGS = {  # TPU blocks: pallas_tpu.TUNING
    "cuda": Lowering(lambda family: GPU_BLOCKS.get(family, GPU_DEFAULT_BLOCKS), 16, True, **_gpu(ptx=True, interpret=False)),
    "tpu": Lowering(lambda family: pallas_tpu.tuning().blocks, 16, True, **_tpu(interpret=False)),
    "interpret": Lowering(lambda family: (64, 64), 8, False, **_gpu(ptx=False, interpret=True)),
    "interpret_tpu": Lowering(lambda family: (64, 64), 8, False, **_tpu(interpret=True)),
}
INTERPRETED = {True: "interpret", "tpu": "interpret_tpu"}  # the `interpret` option: which kernels interpret mode runs
# Families whose kernels split their matmuls by default: the un-normalised rows (sigmoid) round a lone key's score
# gradient once more than the reference, 2.9x its bfloat16 dq error at T = 128 without the split.
SPLIT_BY_DEFAULT = frozenset({"none"})


def _fit(block: int, length: int, lowering: Lowering) -> int:
    """The block length used for a sequence of `length`: near `block`, no longer than needed, at least
    the platform's minimum (and a power of two where the platform needs one)."""
    size = min(block, -(-length // lowering.min_block) * lowering.min_block)
    if lowering.power_of_two:
        size = 1 << (size - 1).bit_length() if size < block else 1 << (block.bit_length() - 1)
    return max(lowering.min_block, size)


def _query_major_specs(cfg: Static, shapes):
    """The forward and dq kernels' input specs (grid (b, h, i)), and those of a [Q, D] block and a [Q, 1] row."""
    (b, h, tp, d), (kv_heads, sp) = shapes
    k_blocks, g = sp // cfg.block_k, cfg.kv_groups
    q_spec = pl.BlockSpec((None, None, cfg.block_q, d), lambda b, h, i: (b, h, i, 0))
    row_spec = pl.BlockSpec((None, None, cfg.block_q, 1), lambda b, h, i: (b, h, i, 0))
    kv_full = pl.BlockSpec((None, None, sp, d), lambda b, h, i: (b, jax.lax.div(h, g), 0, 0))
    key_factors = pl.BlockSpec((None, None, k_blocks, 1, cfg.block_k), lambda b, h, i: (b, jax.lax.div(h, g), 0, 0, 0))
    mask_specs = [
        pl.BlockSpec((2, None, cfg.block_q, 1), lambda b, h, i: (0, b, i, 0)),
        pl.BlockSpec((3, None, k_blocks, 1, cfg.block_k), lambda b, h, i: (0, b, 0, 0, 0)),
        pl.BlockSpec((None, cfg.block_q, 1), lambda b, h, i: (b, i, 0)),
    ]
    q_factors = pl.BlockSpec((None, None, None, 1, cfg.block_q), lambda b, h, i: (b, h, i, 0, 0))
    return [pl.BlockSpec()] * 4 + [q_spec, kv_full, kv_full, q_factors, key_factors, *mask_specs], q_spec, row_spec


def _pass_call(cfg: Static, shapes, which: int, row_names, compiler_params, interpret: bool):
    """The GPU pass kernel's pallas_call: the forward's inputs, the earlier passes' rows and the carry in; the
    carry out (aliasing the carry in)."""
    (b, h, tp, d), _ = shapes
    in_specs, _, row_spec = _query_major_specs(cfg, shapes)
    widths = carry_widths(cfg, which, d)
    carry_specs = [pl.BlockSpec((None, None, cfg.block_q, w), lambda b, h, i: (b, h, i, 0)) for w in widths]
    first_carry = len(in_specs) + len(row_names)
    return pl.pallas_call(
        functools.partial(pass_kernel, cfg, which, tuple(row_names)),
        grid=(b, h, tp // cfg.block_q),
        in_specs=in_specs + [row_spec] * len(row_names) + carry_specs,
        out_specs=carry_specs,
        out_shape=[jax.ShapeDtypeStruct((b, h, tp, w), jnp.float32) for w in widths],
        input_output_aliases={first_carry + x: x for x in range(len(widths))},
        name=f"freeatten_{cfg.family}_pass{which}",
        interpret=interpret,
        compiler_params=compiler_params,
    )


def _calls(cfg: Static, shapes, compiler_params, interpret: bool):
    """The GPU kernels' three pallas_calls (forward, dq, dkv) for arrays of the given padded shapes."""
    (b, h, tp, d), (kv_heads, sp) = shapes
    q_blocks, k_blocks, g = tp // cfg.block_q, sp // cfg.block_k, cfg.kv_groups
    family, forward_family = FAMILIES[cfg.family], kernel_family(cfg)
    common = dict(interpret=interpret, compiler_params=compiler_params)
    f32 = jnp.float32

    # forward and dq: grid (b, h, i); row statistics and rows lane-dense, one [1, Q] row per block
    in_specs, q_spec, _ = _query_major_specs(cfg, shapes)
    row_spec = pl.BlockSpec((None, None, None, 1, cfg.block_q), lambda b, h, i: (b, h, i, 0, 0))
    stat_shapes = [jax.ShapeDtypeStruct((b, h, q_blocks, 1, cfg.block_q), f32)] * len(forward_family.stats)
    out_shape = jax.ShapeDtypeStruct((b, h, tp, d), cfg.dtype)
    extra_shapes = [jax.ShapeDtypeStruct((b, h, tp, d), f32)] * len(forward_family.extras)
    forward = pl.pallas_call(
        functools.partial(forward_kernel, cfg),
        grid=(b, h, q_blocks),
        in_specs=in_specs,
        out_specs=[q_spec] + [row_spec] * len(stat_shapes) + [q_spec] * (len(extra_shapes) + low_half(cfg)),
        out_shape=[out_shape] + stat_shapes + extra_shapes + [out_shape] * low_half(cfg),
        name=f"freeatten_{cfg.family}_fwd",
        **common,
    )
    dq = pl.pallas_call(
        functools.partial(dq_kernel, cfg),
        grid=(b, h, q_blocks),
        in_specs=in_specs + [q_spec] + [row_spec] * len(family.rows),
        out_specs=[q_spec, row_spec][: 1 + cfg.p_grad],
        out_shape=[jax.ShapeDtypeStruct((b, h, tp, d), f32), jax.ShapeDtypeStruct((b, h, q_blocks, 1, cfg.block_q), f32)][
            : 1 + cfg.p_grad
        ],
        name=f"freeatten_{cfg.family}_dq",
        **common,
    )

    # dkv: grid (b, kv head, j), key-major, j a key sub-block of `sub` keys (dkv_split of them a key block)
    split = dkv_split(cfg)
    sub = cfg.block_k // split
    group_spec = pl.BlockSpec((None, g, tp, d), lambda b, k, j: (b, k, 0, 0))
    group_rows = pl.BlockSpec((None, g, q_blocks, 1, cfg.block_q), lambda b, k, j: (b, k, 0, 0, 0))
    k_spec = pl.BlockSpec((None, None, sub, d), lambda b, k, j: (b, k, j, 0))
    k_factors = pl.BlockSpec((None, None, None, 1, sub), lambda b, k, j: (b, k, j // split, 0, j % split))
    dkv_mask_specs = [
        pl.BlockSpec((2, None, q_blocks, 1, cfg.block_q), lambda b, k, j: (0, b, 0, 0, 0)),
        pl.BlockSpec((3, None, sub, 1), lambda b, k, j: (0, b, j, 0)),
        pl.BlockSpec((None, q_blocks, 1, cfg.block_q), lambda b, k, j: (b, 0, 0, 0)),
    ]
    dkv = pl.pallas_call(
        functools.partial(dkv_kernel, cfg),
        grid=(b, kv_heads, k_blocks * split),
        in_specs=[pl.BlockSpec()] * 4
        + [group_spec, k_spec, k_spec, group_rows, k_factors, *dkv_mask_specs, group_spec]
        + [group_rows] * len(family.rows),
        out_specs=[k_spec, k_spec],
        out_shape=[jax.ShapeDtypeStruct((b, kv_heads, sp, d), f32)] * 2,
        name=f"freeatten_{cfg.family}_dkv",
        **common,
    )
    return forward, dq, dkv


def backward_rows(family: str, stats, out, dout, p_1):
    """The row terms of the gradient (D_i = dO_i·O_i, and LSSAR's E_i) in the kernels' order, each [B, H, Tp, 1],
    from row statistics as lane-dense [B, H, I, 1, Q] (as the kernels write them) or [B, H, Tp, 1] (the ring)."""
    stats = {**stats, **{name: stats[name].reshape(*out.shape[:3], 1) for name in FAMILIES[family].stats}}
    rows = FAMILIES[family].backward_rows(stats, out, dout, p_1[0])
    return [rows[name] for name in FAMILIES[family].rows]


def by_blocks(x, size: int):
    """[B, heads, L, 1] -> [B, heads, L / size, 1, size]: one row per block (lane-dense)."""
    return x.reshape(*x.shape[:2], -1, 1, size)


def make_core(cfg: Static, forward_for, run_backward):
    """core(q, k, v, qs, ks, p_1, where) = the kernels' output, with a custom VJP whose residuals are the inputs,
    the output and row statistics. The scores are qs_i ks_j q_i·k_j (float32 factors, the family's score_scale
    in qs, lane-dense as one row per block: qs [B, H, I, 1, Q], ks [B, K, J, 1, C]). forward_for(cfg) gives
    run_forward(q, k, v, qs, ks, p_1, where) -> (out, its low half or None, statistics); without a gradient
    core runs it for cfg.residuals False (the output alone: no statistics, no extras, no low half).
    run_backward(q, k, v, qs, ks, p_1, where, rows (lane-dense), dout) the kernels' (dq, dk sums, dv, dL/dp per
    row or None): sums without the factors of their own side, which this applies, with the factors' own gradients.
    `where` is a pallas_plan.Plan here, a ring in ring_kernels.py."""
    inv_scale = 1.0 / FAMILIES[cfg.family].score_scale  # the family's ds is dL/d(score / score_scale)

    def factor_sum(x, sums, shape):
        """Σ_d x_d sums_d as [B, heads, L] reshaped to the factors' block rows `shape` (lane-dense)."""
        return jnp.sum(x.astype(jnp.float32) * sums, axis=-1).reshape(shape)

    run_output, run_forward = forward_for(cfg._replace(residuals=False)), forward_for(cfg)

    @jax.custom_vjp
    def core(q, k, v, qs, ks, p_1, where):
        return run_output(q, k, v, qs, ks, p_1, where)[0]

    def core_fwd(q, k, v, qs, ks, p_1, where):
        out, low, stats = run_forward(q, k, v, qs, ks, p_1, where)
        return out, (q, k, v, qs, ks, p_1, where, out, low, stats)

    def core_bwd(residuals, dout):
        q, k, v, qs, ks, p_1, where, out, low, stats = residuals
        out_f32 = out if low is None else out.astype(jnp.float32) + low.astype(jnp.float32)
        rows = backward_rows(cfg.family, stats, out_f32, dout, p_1)  # D_i from the float32 output, as the reference's
        rows = [by_blocks(x, cfg.block_q) for x in rows]  # lane-dense [B, H, I, 1, Q], once (the ring's steps reuse them)
        dq_sum, dk_sum, dv, dpow = run_backward(q, k, v, qs, ks, p_1, where, rows, dout)
        dp_1 = jnp.sum(dpow).reshape(1) if cfg.p_grad else None
        dq_sum, dk_sum = dq_sum * inv_scale, dk_sum * inv_scale
        dq, dqs = dq_sum * qs.reshape(q.shape[:3])[..., None], factor_sum(q, dq_sum, qs.shape)
        if not cfg.key_scale:
            return dq.astype(q.dtype), dk_sum.astype(k.dtype), dv.astype(v.dtype), dqs, jnp.zeros_like(ks), dp_1, None
        dk, dks = dk_sum * ks.reshape(k.shape[:3])[..., None], factor_sum(k, dk_sum, ks.shape)
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dqs, dks, dp_1, None

    core.defvjp(core_fwd, core_bwd)
    return core


def mask_args(plan: pallas_plan.Plan, key_major: bool = False):
    """The span arrays and mask arrays a query-major (forward, dq) or the key-major dkv kernel reads."""
    if key_major:
        return plan.q_first, plan.q_end, plan.q_full, plan.q_row, plan.kv_col, plan.n_row
    return plan.k_first, plan.k_end, plan.k_full, plan.q_col, plan.kv_row, plan.n_col


def kernel_backward(cfg: Static, dq_call, dkv_call, q, k, v, qs, ks, p_1, plan: pallas_plan.Plan, rows, dout):
    """The dq and dkv kernels on one plan, the row terms lane-dense: (dq sum, dk sum, dv, dL/dp per row or None), as
    make_core takes them."""
    first, end, full, *masks = mask_args(plan)
    dq_sum, *dpow = dq_call(first, end, full, p_1, q, k, v, qs, ks, *masks, dout, *rows)
    first, end, full, *masks = mask_args(plan, key_major=True)
    dk_sum, dv = dkv_call(first, end, full, p_1, q, k, v, qs, ks, *masks, dout, *rows)
    return dq_sum, dk_sum, dv, dpow[0] if cfg.p_grad else None


def _core(cfg: Static, lowering: Lowering, shapes):
    """The kernels with their custom VJP (make_core) on one device's whole sequence (`where` a Plan)."""
    _, dq_call, dkv_call = lowering.calls(cfg, shapes)

    def forward_for(cfg: Static):
        forward, family = lowering.calls(cfg, shapes)[0], kernel_family(cfg)

        def run_forward(q, k, v, qs, ks, p_1, plan):
            """The output, the statistics and (below float32) the output's low half, pallas_kernels.write_forward."""
            first, end, full, *masks = mask_args(plan)
            out, *stats = forward(first, end, full, p_1, q, k, v, qs, ks, *masks)
            low = stats.pop() if low_half(cfg) else None
            return out, low, dict(zip(family.stats + family.extras, stats))

        return run_forward

    return make_core(cfg, forward_for, functools.partial(kernel_backward, cfg, dq_call, dkv_call))


def factor_rows(x_BLH1, size: int):
    """[B, L, heads, 1] float32 factors -> [B, heads, L / size, 1, size], padding L to whole blocks with 0."""
    x_BHL = jnp.pad(x_BLH1[..., 0].transpose(0, 2, 1), ((0, 0), (0, 0), (0, -x_BLH1.shape[1] % size)))
    return x_BHL.reshape(*x_BHL.shape[:2], -1, 1, size)


def heads_first(x_BLHD, size: int):
    """[B, L, heads, D] -> [B, heads, L padded to whole blocks of `size`, D]."""
    return jnp.pad(x_BLHD.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, -x_BLHD.shape[1] % size), (0, 0)))


def block_lengths(lowering: Lowering, family: str, block_q, block_k, t: int, s: int) -> tuple[int, int]:
    """The (query, key) block lengths the kernels use for t queries and s keys (default: the platform's for the family)."""
    default_q, default_k = lowering.blocks(family)
    return _fit(block_q or default_q, t, lowering), _fit(block_k or default_k, s, lowering)


def _run(lowering: Lowering, cfg: Static, block_q, block_k, q_BTHD, k_BSKD, v_BSKD, qs_BTH1, ks_BSK1, p_1, mask: Mask, n_BT):
    """Pad to whole blocks, lay out as [B, heads, length, D], run the kernels, undo the layout."""
    t, (s, kv_heads) = q_BTHD.shape[1], k_BSKD.shape[1:3]
    q_size, k_size = block_lengths(lowering, cfg.family, block_q, block_k, t, s)
    dkv = cfg.block_k_dkv and max(cfg.block_k_dkv, lowering.min_block)  # at least the platform's minimum, as _fit
    cfg = cfg._replace(block_q=q_size, block_k=k_size, block_k_dkv=dkv, plain_length=t if mask.plain else None)
    plan = pallas_plan.plan(mask, n_BT, q_size, k_size)
    q_BHTD, k_BKSD, v_BKSD = heads_first(q_BTHD, q_size), heads_first(k_BSKD, k_size), heads_first(v_BSKD, k_size)
    qs_BHI1Q, ks_BKJ1C = factor_rows(qs_BTH1 * FAMILIES[cfg.family].score_scale, q_size), factor_rows(ks_BSK1, k_size)
    shapes = (q_BHTD.shape, (kv_heads, k_BKSD.shape[2]))
    out_BHTD = _core(cfg, lowering, shapes)(q_BHTD, k_BKSD, v_BKSD, qs_BHI1Q, ks_BKJ1C, p_1, plan)
    return out_BHTD[:, :, :t].transpose(0, 2, 1, 3)


def _mesh_axes(mesh, names, *sizes):
    """The axes among `names` (sized > 1 in the mesh) whose product divides every size; None if none."""
    axes = [name for name in names if mesh.shape.get(name, 1) > 1]
    while axes and any(size % math.prod(mesh.shape[a] for a in axes) for size in sizes):
        axes.pop()
    return tuple(axes) or None


def _per_shard(run, batch_axes, head_axes):
    """`run(q, k, v, qs, ks, p_1, mask, n_BT)` in shard_map over the ambient mesh (batch over batch_axes, heads
    over head_axes, the rest replicated), or `run` itself outside a mesh of more than one device."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return run

    def sharded(q_BTHD, k_BSKD, v_BSKD, qs_BTH1, ks_BSK1, p_1, mask, n_BT):
        (b, _, h, _), kv_heads = q_BTHD.shape, k_BSKD.shape[2]
        batch = _mesh_axes(mesh, batch_axes, b)
        heads = _mesh_axes(mesh, head_axes, h, kv_heads)
        tokens, rows = P(batch, None, heads, None), P(batch, None)
        specs = (tokens, tokens, tokens, tokens, tokens, P(), jax.tree.map(lambda _: rows, mask), rows)
        return jax.shard_map(run, mesh=mesh, in_specs=specs, out_specs=tokens, check_vma=False)(
            q_BTHD, k_BSKD, v_BSKD, qs_BTH1, ks_BSK1, p_1, mask, n_BT
        )

    return sharded


def kernel_arguments(variant: Variant, mask: Mask, opts, q_BTHD, k_BSKD, v_BSKD, n_B1T, split_matmuls=None):
    """The kernels' Static (blocks unset) and arguments: q, k, v in q's dtype, the variant's float32 factors qs
    [B, T, H, 1] and ks [B, S, K, 1] (ones when it has none; the family's score_scale not yet in qs) and p_1."""
    kind, p = variant.normalise, opts.get("p")
    if kind == "reweight" and p is None:
        kind = "sum"  # re-weighting switched off: plain LSSA
    dtype = q_BTHD.dtype
    qs_BTH1, ks_BSK1 = variant.scales(q_BTHD, k_BSKD, n_B1T, opts)
    key_scale = ks_BSK1 is not None
    ks_BSK1 = ks_BSK1 if key_scale else jnp.ones((*k_BSKD.shape[:3], 1), jnp.float32)  # read by no kernel
    p_1 = jnp.asarray(0.0 if p is None else p, jnp.float32).reshape(1)
    p_grad = kind == "reweight" and isinstance(p, jax.Array)  # a Python number is a constant
    groups = q_BTHD.shape[2] // k_BSKD.shape[2]
    split = kind in SPLIT_BY_DEFAULT if split_matmuls is None else bool(split_matmuls)
    cfg = Static(kind, mask.causal, mask.window, 0, 0, groups, static_power(p), variant.weight, dtype, p_grad, key_scale, split)
    return cfg, (q_BTHD, k_BSKD.astype(dtype), v_BSKD.astype(dtype), qs_BTH1, ks_BSK1, p_1)


def attend(
    q_BTHD,
    k_BSKD,
    v_BSKD,
    *,
    variant: Variant,
    mask: Mask,
    opts,
    block_q=None,
    block_k=None,
    block_k_dkv=None,
    interpret=False,
    split_matmuls=None,
    batch_axes=BATCH_AXES,
    head_axes=HEAD_AXES,
    **unknown,
):
    """o_i = Σ_j A_ij v_j in fused kernels; statistics in float32, matmuls in q's dtype, output in q's dtype.

    block_q, block_k: block lengths (default: the platform's LOWERINGS entry). block_k_dkv: the GPU dK/dV
    kernel's key block, a divisor of the key block (default: the key block; the TPU kernels use theirs): fewer
    registers for its accumulators, which spill at 64 keys and D = 128 (benchmarks/RESULTS.md). interpret=True: run
    the GPU kernels in Pallas interpret mode on any platform (CPU always uses it); "tpu": the TPU ones.
    split_matmuls: True, the float32 weights and score gradients enter their bfloat16 matmuls as two halves
    (pallas_kernels.weighted_dot), for 1.3-1.5x the matmuls; False, they are rounded once to bfloat16, as
    FlashAttention does; None: False but for SPLIT_BY_DEFAULT, so that every variant keeps FlashAttention's
    precision contract (docs/method.md: at most 2x the bfloat16 reference's error). batch_axes, head_axes:
    the ambient mesh's axes that shard the batch and the heads (the kernels run per shard). Keys no
    query sees are zeroed first (hide_unseen, as in blockwise); a dense `mask` is refused (the
    kernels read only the structured mask fields)."""
    if unknown:
        raise ValueError(
            f"unknown option(s) {sorted(unknown)}; implementation 'pallas' takes block_q, block_k, block_k_dkv, "
            "interpret, split_matmuls, batch_axes, head_axes"
        )
    if mask.dense is not None:
        raise ValueError("implementation 'pallas' does not take a dense `mask`; use 'blockwise' or 'reference'")
    check_positive_int("block_q", block_q)
    check_positive_int("block_k", block_k)
    check_positive_int("block_k_dkv", block_k_dkv)
    if interpret and interpret not in INTERPRETED:
        raise ValueError(f"interpret must be False, True (the GPU kernels) or 'tpu' (the TPU kernels), got {interpret!r}")
    n_B1T, seen_B1S = count_visible(mask, 512)
    k_BSKD, v_BSKD = hide_unseen(k_BSKD, v_BSKD, seen_B1S)
    cfg, args = kernel_arguments(variant, mask, opts, q_BTHD, k_BSKD, v_BSKD, n_B1T, split_matmuls)
    cfg = cfg._replace(block_k_dkv=block_k_dkv)
    run = lambda name: functools.partial(_run, LOWERINGS[name], cfg, block_q, block_k)  # noqa: E731
    if interpret:
        per_platform = run(INTERPRETED[interpret])
    else:
        per_platform = functools.partial(jax.lax.platform_dependent, cuda=run("cuda"), tpu=run("tpu"), cpu=run("interpret"))
    return _per_shard(per_platform, batch_axes, head_axes)(*args, mask, n_B1T[:, 0])
