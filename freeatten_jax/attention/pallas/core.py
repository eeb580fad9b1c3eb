"""The platform-neutral half of the kernel path: the lowering table, the kernels' arguments and layouts, and the
custom VJP around the kernels that one device (api.py) and the ring (ring.py) share.

Glossary: B batch, T queries, S keys, H heads, K kv heads, G = H // K, D head dim, Tp / Sp lengths padded to
whole blocks, I / J number of query / key blocks, Q / C their lengths. The kernels take q and k as given (in
the input dtype: bfloat16 is rounded once, not again after normalising) and the variant's float32 factors of
the scores apart (`scales`, outside the kernels, so autodiff carries their gradients, e.g. to SSMax's s and b);
statistics are float32. The custom VJP saves only the output and per-row statistics (without a gradient the
forward kernel writes the output alone: rules.output_only); the backward recomputes scores in a dQ kernel (per
query block) and a key-major dK/dV kernel (per key block, summing the G query heads: no repeated K/V).
"""

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from freeatten_jax.attention.pallas import gpu, mosaic_gpu, tpu
from freeatten_jax.attention.pallas.common import BlockSizes, KernelRefs, Spans, Static, kernel_family, low_half
from freeatten_jax.attention.pallas.plan import Plan
from freeatten_jax.attention.rules import FAMILIES, static_power
from freeatten_jax.attention.variants import Mask, Variant


class Lowering(NamedTuple):
    """How one platform compiles the kernels."""

    blocks: Callable[[str], tuple[int, int]]  # blocks(family) -> default (block_q, block_k)
    min_block: int
    power_of_two: bool  # block lengths must be powers of two (Triton, Mosaic)
    calls: Callable  # calls(cfg, shapes) -> the (forward, dq, dkv) pallas_calls, each called as call(Spans, KernelRefs)
    pass_call: Callable  # pass_call(cfg, shapes, which, row_names, fresh) -> one forward pass from a carry (ring.py)
    lanes: int = 0  # the HBM row width that [.., L, D] arrays with a narrower D are packed to (Static.pack); 0: never


def _gpu(ptx: bool, interpret: bool, blocks=gpu.blocks, min_block: int = 16) -> Lowering:
    """The GPU kernels compiled by Triton (with inline PTX on CUDA) or run in interpret mode."""
    calls = functools.partial(gpu.calls, ptx=ptx, interpret=interpret)
    return Lowering(blocks, min_block, not interpret, calls, functools.partial(gpu.pass_call, ptx=ptx, interpret=interpret))


def _tpu(interpret: bool, blocks=lambda family: tpu.tuning().blocks, min_block: int = 16) -> Lowering:
    """The TPU kernels compiled by Mosaic (blocks: tpu.TUNING) or run in interpret mode."""
    calls, pass_call = (functools.partial(f, interpret=interpret) for f in (tpu.calls, tpu.pass_call))
    return Lowering(blocks, min_block, not interpret, calls, pass_call, lanes=128)


def _mosaic_gpu(interpret: bool) -> Lowering:
    """The forward compiled by Mosaic GPU (Hopper) or run in interpret mode, with gpu.py's backward and pass kernels,
    which read the statistics it writes."""

    def calls(cfg: Static, shapes):
        _, dq, dkv = gpu.calls(cfg, shapes, ptx=not interpret, interpret=interpret)
        return mosaic_gpu.forward_call(cfg, shapes, interpret=interpret), dq, dkv

    pass_call = functools.partial(gpu.pass_call, ptx=not interpret, interpret=interpret)
    return Lowering(mosaic_gpu.blocks, mosaic_gpu.ROWS, True, calls, pass_call)


INTERPRET_BLOCKS = lambda family: (64, 64)  # noqa: E731
LOWERINGS = {  # by jax's platform names, and the interpret modes
    "cuda": _gpu(ptx=True, interpret=False),
    "rocm": _gpu(ptx=False, interpret=False),  # Triton without inline PTX (not compiled here: no ROCm plugin)
    "tpu": _tpu(interpret=False),
    "interpret": _gpu(ptx=False, interpret=True, blocks=INTERPRET_BLOCKS, min_block=8),
    "interpret_tpu": _tpu(interpret=True, blocks=INTERPRET_BLOCKS, min_block=8),
    "mosaic_gpu": _mosaic_gpu(interpret=False),
    "interpret_mosaic_gpu": _mosaic_gpu(interpret=True),
}
ON_THE_CPU = "interpret"  # the CPU has no kernel compiler: the GPU kernels in interpret mode
INTERPRETED = {True: "interpret", "tpu": "interpret_tpu"}  # the `interpret` option: which kernels interpret mode runs
# The `gpu_kernels` option: the lowerings that replace the Triton ones (on CUDA and with interpret=True). Mosaic GPU
# runs the forward of LSSA on plain masks (mosaic_gpu.check); `auto` does not choose it yet.
GPU_KERNELS = {"triton": {}, "mosaic_gpu": {"cuda": "mosaic_gpu", "interpret": "interpret_mosaic_gpu"}}
# Families whose kernels split their matmuls by default: the un-normalised rows (sigmoid) round a lone key's score
# gradient once more than the reference, 2.9x its bfloat16 dq error at T = 128 without the split.
SPLIT_BY_DEFAULT = frozenset({"none"})


def check_interpret(interpret) -> None:
    """A ValueError for an `interpret` option that names no kernels."""
    if interpret and interpret not in INTERPRETED:
        raise ValueError(f"interpret must be False, True (the GPU kernels) or 'tpu' (the TPU kernels), got {interpret!r}")


def check_gpu_kernels(gpu_kernels) -> None:
    """A ValueError for a `gpu_kernels` option that names no kernels."""
    if gpu_kernels not in GPU_KERNELS:
        raise ValueError(f"gpu_kernels must be one of {', '.join(map(repr, GPU_KERNELS))}, got {gpu_kernels!r}")


def choose_lowering(interpret, on_the_cpu: str = ON_THE_CPU, gpu_kernels: str = "triton"):
    """platform -> the LOWERINGS entry the kernels run there: the `interpret` option's everywhere, else the
    platform's own (`on_the_cpu` on the CPU), the GPU ones as `gpu_kernels` names them (GPU_KERNELS). The CPU keeps
    `on_the_cpu` beside compiled branches: the Mosaic GPU interpreter's ordered callbacks do not lower inside
    platform_dependent's branches."""
    rename = GPU_KERNELS[gpu_kernels]
    if interpret:
        return lambda platform: rename.get(INTERPRETED[interpret], INTERPRETED[interpret])
    return lambda platform: on_the_cpu if platform == "cpu" else rename.get(platform, platform)


def _fit(block: int, length: int, lowering: Lowering) -> int:
    """The block length used for a sequence of `length`: near `block`, no longer than needed, at least
    the platform's minimum (and a power of two where the platform needs one)."""
    size = min(block, -(-length // lowering.min_block) * lowering.min_block)
    if lowering.power_of_two:
        size = 1 << (size - 1).bit_length() if size < block else 1 << (block.bit_length() - 1)
    return max(lowering.min_block, size)


def sized(lowering: Lowering, cfg: Static, requested: tuple, t: int, s: int, d: int) -> Static:
    """cfg with the block lengths for t queries and s keys of head dim d (from the `requested` (block_q, block_k,
    block_k_dkv), None: the platform's default for the family) and the packing they allow."""
    (block_q, block_k, block_k_dkv), (default_q, default_k) = requested, lowering.blocks(cfg.family)
    k_dkv = block_k_dkv and max(block_k_dkv, lowering.min_block)  # the dK/dV key block at least the platform's minimum
    blocks = BlockSizes(_fit(block_q or default_q, t, lowering), _fit(block_k or default_k, s, lowering), k_dkv)
    return cfg._replace(blocks=blocks, pack=_packing(lowering, d, blocks))


def _packing(lowering: Lowering, d: int, blocks: BlockSizes) -> int:
    """Static.pack for head dim d: the tokens a `lanes`-wide HBM row holds where d divides it (a TPU pads a [.., L, 64]
    array to 128 lanes: twice its bytes) and every block packs into whole 16-row tiles; else 1."""
    f = lowering.lanes // d if lowering.lanes and d < lowering.lanes and lowering.lanes % d == 0 else 1
    return f if blocks.q % (16 * f) == 0 and blocks.k % (16 * f) == 0 else 1


def packed(cfg: Static, x_BHLD, size: int):
    """[B, heads, L, D] -> the kernels' [B, heads, L / f, f D] (Static.pack f): in each block of `size` tokens, packed
    row r holds tokens r, r + size / f, ... (common.unpack reads a block back)."""
    if cfg.pack == 1:
        return x_BHLD
    b, h, length, d = x_BHLD.shape
    x = x_BHLD.reshape(b, h, length // size, cfg.pack, size // cfg.pack, d).transpose(0, 1, 2, 4, 3, 5)
    return x.reshape(b, h, length // cfg.pack, cfg.pack * d)


def unpacked(cfg: Static, x, size: int):
    """packed's inverse: the kernels' [B, heads, L / f, f D] -> [B, heads, L, D]."""
    if cfg.pack == 1:
        return x
    b, h, rows, width = x.shape
    d = width // cfg.pack
    y = x.reshape(b, h, rows * cfg.pack // size, size // cfg.pack, cfg.pack, d).transpose(0, 1, 2, 4, 3, 5)
    return y.reshape(b, h, rows * cfg.pack, d)


def packed_operands(cfg: Static, q, k, v, *dout):
    """q, k, v (and dout) [B, heads, L, D] as the kernels read them (packed)."""
    keys = [packed(cfg, x, cfg.blocks.k) for x in (k, v)]
    return packed(cfg, q, cfg.blocks.q), *keys, *[packed(cfg, x, cfg.blocks.q) for x in dout]


def unpacked_sums(cfg: Static, dq_sum, dk_sum, dv) -> tuple:
    """The backward kernels' sums as [B, heads, L, D] (unpacked)."""
    return unpacked(cfg, dq_sum, cfg.blocks.q), unpacked(cfg, dk_sum, cfg.blocks.k), unpacked(cfg, dv, cfg.blocks.k)


def kernel_arguments(variant: Variant, mask: Mask, opts, q_BTHD, k_BSKD, v_BSKD, n_B1T, split_matmuls=None):
    """The kernels' Static (blocks unset) and arguments: q, k, v in q's dtype, the variant's float32 factors qs
    [B, T, H, 1] and ks [B, S, K, 1] (ones when it has none; the family's score_scale not yet in qs) and p_1."""
    kind, p = variant.rule(opts), opts.get("p")
    dtype = q_BTHD.dtype
    qs_BTH1, ks_BSK1 = variant.scales(q_BTHD, k_BSKD, n_B1T, opts)
    key_scale = ks_BSK1 is not None
    ks_BSK1 = ks_BSK1 if key_scale else jnp.ones((*k_BSKD.shape[:3], 1), jnp.float32)  # read by no kernel
    p_1 = jnp.asarray(0.0 if p is None else p, jnp.float32).reshape(1)
    p_grad = kind == "reweight" and isinstance(p, jax.Array)  # a Python number is a constant
    groups = q_BTHD.shape[2] // k_BSKD.shape[2]
    split = kind in SPLIT_BY_DEFAULT if split_matmuls is None else bool(split_matmuls)
    cfg = Static(
        family=kind,
        causal=mask.causal,
        window=mask.window,
        blocks=BlockSizes(0, 0),
        kv_groups=groups,
        static_power=static_power(p),
        weight=variant.weight,
        dtype=dtype,
        p_grad=p_grad,
        key_scale=key_scale,
        split=split,
    )
    return cfg, (q_BTHD, k_BSKD.astype(dtype), v_BSKD.astype(dtype), qs_BTH1, ks_BSK1, p_1)


def heads_first(x_BLHD, size: int):
    """[B, L, heads, D] -> [B, heads, L padded to whole blocks of `size`, D]."""
    return jnp.pad(x_BLHD.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, -x_BLHD.shape[1] % size), (0, 0)))


def factor_rows(x_BLH1, size: int):
    """[B, L, heads, 1] float32 factors -> [B, heads, L / size, 1, size], padding L to whole blocks with 0."""
    x_BHL = jnp.pad(x_BLH1[..., 0].transpose(0, 2, 1), ((0, 0), (0, 0), (0, -x_BLH1.shape[1] % size)))
    return x_BHL.reshape(*x_BHL.shape[:2], -1, 1, size)


def kernel_layout(cfg: Static, q_BTHD, k_BSKD, v_BSKD, qs_BTH1, ks_BSK1):
    """The kernels' operands, heads first and padded to whole blocks: q, k, v [B, heads, L, D] and the factors as
    lane-dense block rows (qs [B, H, I, 1, Q] with the family's score_scale, ks [B, K, J, 1, C]), and their shapes."""
    q_size, k_size = cfg.blocks.q, cfg.blocks.k
    q_BHTD, k_BKSD, v_BKSD = heads_first(q_BTHD, q_size), heads_first(k_BSKD, k_size), heads_first(v_BSKD, k_size)
    qs_BHI1Q = factor_rows(qs_BTH1 * FAMILIES[cfg.family].score_scale, q_size)
    shapes = (q_BHTD.shape, (k_BSKD.shape[2], k_BKSD.shape[2]))
    return (q_BHTD, k_BKSD, v_BKSD, qs_BHI1Q, factor_rows(ks_BSK1, k_size)), shapes


def kernel_inputs(plan: Plan, p_1, q, k, v, qs, ks, key_major: bool = False, **backward) -> tuple[Spans, KernelRefs]:
    """A query-major (forward, dq, pass) or the key-major dK/dV kernel's inputs on one plan; `backward`: dout and
    rows, a pass kernel's rows and carry (KernelRefs' fields)."""
    if key_major:
        spans, masks = Spans(plan.q_first, plan.q_end, plan.q_full), (plan.q_row, plan.kv_col, plan.n_row)
    else:
        spans, masks = Spans(plan.k_first, plan.k_end, plan.k_full), (plan.q_col, plan.kv_row, plan.n_col)
    return spans, KernelRefs(p_1, q, k, v, qs, ks, *masks, **backward)


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
    `where` is a plan.Plan on one device (single_device_core), a ring.Ring round the ring (pallas/ring.py)."""
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
        rows = [by_blocks(x, cfg.blocks.q) for x in rows]  # lane-dense [B, H, I, 1, Q], once (the ring's steps reuse them)
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


def kernel_backward(cfg: Static, dq_call, dkv_call, q, k, v, qs, ks, p_1, plan: Plan, rows, dout):
    """The dq and dkv kernels on one plan, the row terms lane-dense, q, k, v, dout and the sums packed: (dq sum, dk sum,
    dv, dL/dp per row or None), as make_core takes them once unpacked."""
    backward = dict(dout=dout, rows=tuple(rows))
    dq_sum, *dpow = dq_call(*kernel_inputs(plan, p_1, q, k, v, qs, ks, **backward))
    dk_sum, dv = dkv_call(*kernel_inputs(plan, p_1, q, k, v, qs, ks, key_major=True, **backward))
    return dq_sum, dk_sum, dv, dpow[0] if cfg.p_grad else None


def single_device_core(cfg: Static, lowering: Lowering, shapes):
    """The kernels with their custom VJP (make_core) on one device's whole sequence (`where` a Plan)."""
    _, dq_call, dkv_call = lowering.calls(cfg, shapes)

    def forward_for(cfg: Static):
        forward, family = lowering.calls(cfg, shapes)[0], kernel_family(cfg)

        def run_forward(q, k, v, qs, ks, p_1, plan: Plan):
            """The output, the statistics and (below float32) the output's low half, common.write_forward."""
            q, k, v = packed_operands(cfg, q, k, v)
            out, *stats = forward(*kernel_inputs(plan, p_1, q, k, v, qs, ks))
            low = unpacked(cfg, stats.pop(), cfg.blocks.q) if low_half(cfg) else None
            rows, extras = stats[: len(family.stats)], [unpacked(cfg, x, cfg.blocks.q) for x in stats[len(family.stats) :]]
            return unpacked(cfg, out, cfg.blocks.q), low, dict(zip(family.stats + family.extras, rows + extras))

        return run_forward

    def run_backward(q, k, v, qs, ks, p_1, plan: Plan, rows, dout):
        q, k, v, dout = packed_operands(cfg, q, k, v, dout)
        *sums, dpow = kernel_backward(cfg, dq_call, dkv_call, q, k, v, qs, ks, p_1, plan, rows, dout)
        return *unpacked_sums(cfg, *sums), dpow

    return make_core(cfg, forward_for, run_backward)
