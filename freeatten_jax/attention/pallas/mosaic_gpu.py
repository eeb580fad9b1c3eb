"""The Mosaic GPU (Hopper, sm_90a) forward kernel: FlashAttention-3's structure on the families' row maths.

Glossary: B batch, H heads, K kv heads, G = H // K, Tp / Sp padded lengths, Tc = Tp padded to whole CTA tiles, Q = 64
query rows a consumer warpgroup holds (one wgmma M; the kernels' query block), C key block, D head dim, I = Tc / Q
query blocks, J = Sp / C key blocks, R ring slots. One CTA (grid (H, Tc / 2Q, B)) runs three warpgroups: two
consumers of Q rows each and a producer that feeds K and V blocks by TMA into an R-slot shared-memory ring, each
slot guarded by a "loaded" barrier (TMA -> consumers) and a "consumed" one (both consumers -> TMA). The consumers
pingpong on a barrier, so that one's elementwise maths runs under the other's matmuls; the weights enter the PV
matmul from registers; a causal tile visits only the key blocks at or below its diagonal, unmasked below it.
The statistics and the output's low half are those gpu.py's forward writes, so its dQ and dK/dV kernels serve as
the backward (core.py). interpret=True runs it on the CPU (InterpretGPUParams); the interpreter of the pinned jax
lacks a few constructs, replaced under the "interpret switches" below: those are the only differences.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith, llvm, vector
from jax.experimental import pallas as pl
from jax.experimental.mosaic.gpu import fragmented_array, utils
from jax.experimental.pallas import mosaic_gpu as plgpu

from freeatten_jax.attention.pallas.common import KernelRefs, Spans, Static, forward_outputs, kernel_family, low_half
from freeatten_jax.attention.rules import LOG2_1P_4, TINY, log2_1p, neg_abs

ROWS = 64  # query rows per consumer warpgroup
CONSUMERS = 2
SLOTS = 2  # R
KEY_BLOCKS = (64, 128)
HEAD_DIMS = (64, 128)
FAMILIES = ("sum",)
DTYPES = (jnp.bfloat16, jnp.float16)
CONSUMER_REGISTERS, PRODUCER_REGISTERS = 232, 40


def blocks(family: str) -> tuple[int, int]:
    """The default (block_q, block_k): a warpgroup's rows and the key block of attention_mgpu's H100 tuning."""
    return ROWS, 128


def check(cfg: Static, d: int) -> None:
    """A ValueError naming what this kernel does not run (every other case is Triton's, gpu.py)."""
    why = []
    if cfg.family not in FAMILIES:
        why.append(f"family {cfg.family!r} (it runs {', '.join(FAMILIES)})")
    if cfg.plain_length is None or cfg.window is not None:
        why.append("masks beyond plain causal/non-causal (segments, offsets, padding masks, windows)")
    if jnp.dtype(cfg.dtype) not in map(jnp.dtype, DTYPES):
        why.append(f"dtype {jnp.dtype(cfg.dtype).name} (wgmma runs 16-bit inputs; float32 would round to tf32)")
    if cfg.split:
        why.append("split_matmuls")
    if d not in HEAD_DIMS:
        why.append(f"head dim {d} (it runs {HEAD_DIMS})")
    if cfg.blocks.q != ROWS or cfg.blocks.k not in KEY_BLOCKS:
        why.append(f"blocks {cfg.blocks.q} x {cfg.blocks.k} (it runs {ROWS} x {KEY_BLOCKS})")
    if why:
        raise ValueError("the Mosaic GPU kernels do not take " + "; ".join(why))


# ----------------------------------------------------------------------------- interpret switches
# The pinned jax's GPU interpreter lacks: layouts (layout_cast, plgpu.load's layout, broadcasted_iota's; they only
# name a register layout), pl.run_state (the PV accumulator carried into the wgmma), a transposed shared-memory
# operand (K^T: the interpreter reads K transposed in HBM instead) and a register A operand (the weights go
# through shared memory).


def _laid_out(interpret: bool, x, layout):
    return x if interpret else plgpu.layout_cast(x, layout)


def _load(interpret: bool, ref, layout):
    return ref[...] if interpret else plgpu.load(ref, (), layout=layout)


def _iota(interpret: bool, shape, dim: int):
    if interpret:
        return lax.broadcasted_iota(jnp.int32, shape, dim)
    return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=plgpu.Layout.WGMMA)


def _keys_in_hbm(interpret: bool, k_BKSD):
    """K as the producer reads it: [B, K, Sp, D], or [B, K, D, Sp] for the interpreter."""
    return k_BKSD.transpose(0, 1, 3, 2) if interpret else k_BKSD


def _key_tile(interpret: bool, k_ref, b, kv_head, start, size: int):
    keys = pl.ds(start, size)
    return k_ref.at[b, kv_head, :, keys] if interpret else k_ref.at[b, kv_head, keys]


def _key_smem_shape(interpret: bool, c: int, d: int) -> tuple[int, int, int]:
    return (SLOTS, d, c) if interpret else (SLOTS, c, d)


def _keys_transposed(interpret: bool, k_smem):
    """A slot's K as the QK wgmma's B operand, [D, C]."""
    return k_smem if interpret else plgpu.transpose_ref(k_smem, (1, 0))


def _weights_operand(interpret: bool, w, p_smem):
    """The PV wgmma's A operand: the weights in registers, or staged through shared memory."""
    if not interpret:
        return w
    p_smem[...] = w
    plgpu.commit_smem()
    return p_smem


def _rounded(interpret: bool, u_QC, dtype):
    """(w, w as float32): u rounded to the matmul dtype; bfloat16 two values an instruction (cvt.rn.bf16x2.f32) and
    read back by one bitwise op a value (Mosaic's astype rounds one value at a time, packs the pairs, and unpacks them
    by a permute and a shift: 1.1 instructions a score more)."""
    if interpret or jnp.dtype(dtype) != jnp.dtype(jnp.bfloat16):
        w_QC = u_QC.astype(dtype)
        return w_QC, w_QC.astype(jnp.float32)
    layout = plgpu.Layout.WGMMA

    @plgpu.inline_mgpu(
        arg_types=(layout,),
        return_type=(
            plgpu.ShapeDtypeStruct(u_QC.shape, dtype, layout=layout),
            plgpu.ShapeDtypeStruct(u_QC.shape, jnp.float32, layout=layout),
        ),
    )
    def pairs(ctx, u):
        i32, f32 = ir.IntegerType.get_signless(32), ir.F32Type.get()
        pair = ir.VectorType.get((2,), ir.BF16Type.get())
        packed_regs, wide_regs = np.empty_like(u.registers), np.empty_like(u.registers)
        for index, reg in np.ndenumerate(u.registers):
            a, b = (vector.extract(reg, [], [i]) for i in (0, 1))
            # b to the high half, a to the low (PTX's operand order; Mosaic's pairwise converts flip them alike)
            packed = llvm.inline_asm(i32, [a, b], "cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f")
            packed_regs[index] = utils.bitcast(packed, pair)
            low = arith.shli(packed, arith.constant(i32, 16))
            high = arith.andi(packed, arith.constant(i32, -65536))
            wide_regs[index] = vector.from_elements(ir.VectorType.get((2,), f32), [utils.bitcast(x, f32) for x in (low, high)])
        as_array = lambda regs: fragmented_array.FragmentedArray(_registers=regs, _layout=u.layout, _is_signed=None)  # noqa: E731
        return as_array(packed_regs), as_array(wide_regs)

    return pairs(u_QC)


def _accumulate(interpret: bool, pv, acc, shape):
    """acc after pv(acc_ref) issues its wgmmas into it."""
    if not interpret:
        return pl.run_state(pv)(plgpu.ACC.init(acc))
    return acc + pl.run_scoped(lambda acc_ref: (pv(acc_ref), acc_ref[...])[1], plgpu.ACC(shape, jnp.float32))


# ----------------------------------------------------------------------------- the families' rows


def _sum_weights(s_QC, vis, z_Q, dtype, interpret=False):
    """LSSA's weights u = softplus(s) in base 2 (rules.softplus_and_sigmoid's first half, the log by the degree-4
    polynomial: the weights are 16-bit) rounded to the matmul dtype, and Z_i summed from the rounded weights, as the
    PV matmul takes them (gpu.rounded_row_sum's rule)."""
    u_QC = log2_1p(jnp.exp2(neg_abs(s_QC)), jnp.maximum(s_QC, 0.0), coeffs=LOG2_1P_4)
    if vis is not None:
        u_QC = jnp.where(vis, u_QC, 0.0)
    w_QC, rounded_QC = _rounded(interpret, u_QC, dtype)
    return w_QC, z_Q + jnp.sum(rounded_QC, axis=1)


def _finish(acc_QD, z_Q):
    """out = acc / Z and the statistic Z (rules' sum finish)."""
    z_Q = jnp.maximum(z_Q, TINY)
    return acc_QD / lax.broadcast_in_dim(z_Q, acc_QD.shape, [0]), z_Q


# ----------------------------------------------------------------------------- the kernel


def _kernel(cfg: Static, interpret: bool, shapes, refs, scoped):
    (_, _, _, d), (_, sp) = shapes
    c, dtype, length = cfg.blocks.k, cfg.dtype, cfg.plain_length
    q_ref, k_ref, v_ref, qs_ref, ks_ref, out_ref, *stat_refs = refs
    z_ref, lo_ref = (stat_refs + [None, None])[:2] if cfg.residuals else (None, None)
    smem, loaded, consumed, schedule = scoped
    qo_smem2, k_smem, v_smem, qs_smem2, ks_smem, z_smem2, lo_smem2, p_smem2 = smem
    k_bar, v_bar, ks_bar, q_bar = loaded
    k_done, v_done = consumed
    b, h, tile, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("q_tile"), lax.axis_index("wg")
    kv_head = lax.div(h, jnp.array(cfg.kv_groups, h.dtype))
    num_blocks = sp // c
    tile_end = (tile + 1) * (CONSUMERS * ROWS)
    max_steps = pl.cdiv(jnp.minimum(tile_end, sp), jnp.array(c, jnp.int32)) if cfg.causal else num_blocks
    slot_of = lambda step: lax.rem(step, jnp.array(SLOTS, step.dtype))  # noqa: E731

    def schedule_barrier():
        plgpu.barrier_arrive(schedule)
        plgpu.barrier_wait(schedule)

    @pl.when(wg < CONSUMERS)
    def _consumer():
        plgpu.set_max_registers(CONSUMER_REGISTERS, action="increase")
        qo_smem, qs_smem, block = qo_smem2.at[wg], qs_smem2.at[wg], tile * CONSUMERS + wg
        q_base = block * ROWS
        plgpu.copy_gmem_to_smem(q_ref.at[b, h, pl.ds(q_base, ROWS)], qo_smem, q_bar.at[wg])
        plgpu.copy_gmem_to_smem(qs_ref.at[b, h, block], qs_smem, q_bar.at[CONSUMERS + wg])
        plgpu.barrier_wait(q_bar.at[wg])
        plgpu.barrier_wait(q_bar.at[CONSUMERS + wg])
        qs_Q = _load(interpret, qs_smem, plgpu.Layout.WGMMA.reduce(1))
        # the key blocks this warpgroup visits, [0, steps), of which [0, interior) take no mask
        if cfg.causal:
            steps = pl.cdiv(jnp.minimum(q_base + ROWS, sp), jnp.array(c, jnp.int32))
            interior = jnp.minimum(lax.div(q_base, jnp.array(c, jnp.int32)), length // c)
        else:
            steps, interior = max_steps, length // c
        z_Q = _laid_out(interpret, jnp.zeros((ROWS,), jnp.float32), plgpu.Layout.WGMMA.reduce(1))
        acc_QD = _laid_out(interpret, jnp.zeros((ROWS, d), jnp.float32), plgpu.Layout.WGMMA)

        @pl.when(steps > 0)
        def _():
            plgpu.barrier_wait(k_bar.at[0])

        pl.when(wg == 1)(schedule_barrier)

        def step_fn(masked: bool, step, carry):
            acc_QD, z_Q = carry
            slot = slot_of(step)

            def qk(acc_ref):
                plgpu.wgmma(acc_ref, qo_smem, _keys_transposed(interpret, k_smem.at[slot]))
                schedule_barrier()
                return acc_ref[...]

            s_QC = pl.run_scoped(qk, plgpu.ACC((ROWS, c), jnp.float32))
            s_QC = s_QC * lax.broadcast_in_dim(qs_Q, s_QC.shape, [0])
            if cfg.key_scale:
                plgpu.barrier_wait(ks_bar.at[slot])
                ks_C = _load(interpret, ks_smem.at[slot], plgpu.Layout.WGMMA.reduce(0))
                s_QC = s_QC * lax.broadcast_in_dim(ks_C, s_QC.shape, [1])
            plgpu.barrier_arrive(k_done.at[slot])
            vis = None
            if masked:
                rows = _iota(interpret, (ROWS, c), 0) + q_base
                cols = _iota(interpret, (ROWS, c), 1) + step * c
                vis = cols < length
                if cfg.causal:
                    vis = vis & (cols <= rows)
            w_QC, z_Q = _sum_weights(s_QC, vis, z_Q, dtype, interpret)
            acc_QD, z_Q, w_QC = lax.optimization_barrier((acc_QD, z_Q, w_QC))
            plgpu.barrier_arrive(schedule)
            plgpu.barrier_wait(v_bar.at[slot])
            plgpu.barrier_wait(schedule)

            def pv(acc_ref):
                plgpu.wgmma(
                    acc_ref, _weights_operand(interpret, w_QC, None if p_smem2 is None else p_smem2.at[wg]), v_smem.at[slot]
                )

                @pl.when(step + 1 < steps)
                def _():
                    plgpu.barrier_wait(k_bar.at[slot_of(step + 1)])

            acc_QD = _accumulate(interpret, pv, acc_QD, (ROWS, d))
            plgpu.barrier_arrive(v_done.at[slot])
            return acc_QD, z_Q

        carry = lax.fori_loop(0, interior, functools.partial(step_fn, False), (acc_QD, z_Q))
        acc_QD, z_Q = lax.fori_loop(interior, steps, functools.partial(step_fn, True), carry)

        @pl.loop(steps, max_steps)
        def _flush(step):  # release the slots the other warpgroup still reads, keeping the pingpong's count
            plgpu.barrier_arrive(k_done.at[slot_of(step)])
            plgpu.barrier_arrive(v_done.at[slot_of(step)])
            schedule_barrier()
            schedule_barrier()

        pl.when(wg == 0)(schedule_barrier)
        out_QD, z_Q = _finish(acc_QD, z_Q)
        hi_QD = out_QD.astype(dtype)
        qo_smem[...] = hi_QD
        if lo_ref is not None:
            lo_smem2.at[wg][...] = (out_QD - hi_QD.astype(jnp.float32)).astype(dtype)
        if z_ref is not None:
            z_smem2.at[wg][...] = z_Q
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(qo_smem, out_ref.at[b, h, pl.ds(q_base, ROWS)])
        if lo_ref is not None:
            plgpu.copy_smem_to_gmem(lo_smem2.at[wg], lo_ref.at[b, h, pl.ds(q_base, ROWS)])
        if z_ref is not None:
            plgpu.copy_smem_to_gmem(z_smem2.at[wg], z_ref.at[b, h, block])
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == CONSUMERS)
    def _producer():
        plgpu.set_max_registers(PRODUCER_REGISTERS, action="decrease")

        def load(step, slot):
            start = step * c
            plgpu.copy_gmem_to_smem(_key_tile(interpret, k_ref, b, kv_head, start, c), k_smem.at[slot], k_bar.at[slot])
            if cfg.key_scale:
                plgpu.copy_gmem_to_smem(ks_ref.at[b, kv_head, step], ks_smem.at[slot], ks_bar.at[slot])
            plgpu.copy_gmem_to_smem(v_ref.at[b, kv_head, pl.ds(start, c)], v_smem.at[slot], v_bar.at[slot])

        for i in range(min(SLOTS, num_blocks)):
            pl.when(i < max_steps)(functools.partial(load, i, i))

        @pl.loop(0, max_steps - SLOTS)
        def _refill(step):
            slot = slot_of(step)
            plgpu.barrier_wait(k_done.at[slot])
            plgpu.barrier_wait(v_done.at[slot])
            load(step + SLOTS, slot)

        @pl.loop(jnp.maximum(max_steps - SLOTS, 0), max_steps)
        def _drain(step):  # observe the last releases (the interpreter checks that every phase is; free on a GPU)
            plgpu.barrier_wait(k_done.at[slot_of(step)])
            plgpu.barrier_wait(v_done.at[slot_of(step)])


def _scratch(cfg: Static, interpret: bool, d: int):
    """The shared memory (swizzled 128-byte rows for wgmma operands) and the barriers."""
    c, dtype = cfg.blocks.k, cfg.dtype
    mma = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    stats, low = cfg.residuals, low_half(cfg)
    smem = (
        plgpu.SMEM((CONSUMERS, ROWS, d), dtype, transforms=mma),
        plgpu.SMEM(_key_smem_shape(interpret, c, d), dtype, transforms=mma),
        plgpu.SMEM((SLOTS, c, d), dtype, transforms=mma),
        plgpu.SMEM((CONSUMERS, ROWS), jnp.float32),
        plgpu.SMEM((SLOTS, c), jnp.float32) if cfg.key_scale else None,
        plgpu.SMEM((CONSUMERS, ROWS), jnp.float32) if stats else None,
        plgpu.SMEM((CONSUMERS, ROWS, d), dtype, transforms=mma) if low else None,
        plgpu.SMEM((CONSUMERS, ROWS, c), dtype, transforms=mma) if interpret else None,
    )
    loaded = tuple(plgpu.Barrier(num_barriers=n) for n in (SLOTS, SLOTS, SLOTS, 2 * CONSUMERS))
    consumed = (plgpu.Barrier(num_arrivals=CONSUMERS, num_barriers=SLOTS),) * 2
    return smem, loaded, consumed, plgpu.Barrier(num_arrivals=CONSUMERS)


def _interpret_params(interpret):
    """interpret: False (compile), True or an InterpretGPUParams (e.g. with detect_races)."""
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    return interpret if isinstance(interpret, InterpretGPUParams) else InterpretGPUParams()


def forward_call(cfg: Static, shapes, interpret=False):
    """The forward as call(spans, KernelRefs) -> (out, statistics..., low half), gpu.py's outputs for the same cfg
    (core.py pairs it with gpu.py's backward).
        A plain mask's spans are known while tracing: `spans` and the mask arrays go unread."""
    (b_size, h_size, tp, d), (kv_heads, sp) = shapes
    check(cfg, d)
    tile = CONSUMERS * ROWS
    tc = -(-tp // tile) * tile
    kernel_shapes = ((b_size, h_size, tc, d), (kv_heads, sp))
    _, out_types = forward_outputs(cfg, kernel_shapes, None, None)
    family = kernel_family(cfg)
    # z as [B, H, I, Q] rows: one TMA per warpgroup
    out_types = [jax.ShapeDtypeStruct(x.shape[:3] + x.shape[4:], x.dtype) if x.ndim == 5 else x for x in out_types]
    params = dict(interpret=_interpret_params(interpret)) if interpret else {}

    def entry(*refs):
        pl.run_scoped(
            lambda *scoped: _kernel(cfg, bool(interpret), kernel_shapes, refs, scoped),
            *_scratch(cfg, bool(interpret), d),
            collective_axes="wg",
        )

    kernel = plgpu.kernel(
        entry,
        out_type=out_types,
        grid=(h_size, tc // tile, b_size),
        grid_names=("heads", "q_tile", "batch"),
        num_threads=CONSUMERS + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
        kernel_name=f"freeatten_{cfg.family}_fwd_mgpu",
        **params,
    )

    def call(spans: Spans, x: KernelRefs):
        del spans
        pad = tc - tp
        q = jnp.pad(x.q, ((0, 0), (0, 0), (0, pad), (0, 0)))
        qs = jnp.pad(x.qs[:, :, :, 0], ((0, 0), (0, 0), (0, pad // ROWS), (0, 0)))
        ks = x.ks[:, :, :, 0] if cfg.key_scale else jnp.zeros((1, 1, 1, 16), jnp.float32)
        out, *rest = kernel(q, _keys_in_hbm(bool(interpret), x.k), x.v, qs, ks)
        stats = [z[:, :, : tp // ROWS, None] for z in rest[: len(family.stats)]]
        return [out[:, :, :tp], *stats, *[lo[:, :, :tp] for lo in rest[len(family.stats) :]]]

    return call
