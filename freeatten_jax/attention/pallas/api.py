"""implementation="pallas": fused kernels for every variant (docs/method.md §3), forward and backward, per device.

Glossary: B batch, T queries, S keys, H heads, K kv heads, D head dim. The kernels per platform (core.LOWERINGS):
Triton on CUDA (gpu.py; on ROCm without inline PTX), Mosaic on TPU (tpu.py), interpret mode on the CPU (or anywhere
with interpret=True, or "tpu" for the TPU kernels); chosen while tracing (platforms.platform_dependent), so
cross-platform lowering is right. gpu_kernels="mosaic_gpu" takes LSSA's forward on CUDA (and with interpret=True)
from the Mosaic GPU kernel (mosaic_gpu.py), its backward from Triton's. Inside a mesh (the ambient one,
`jax.set_mesh`) the kernels run in `shard_map`, each device on its shard: the SPMD partitioner cannot split a Pallas
call (Mosaic refuses; Triton calls get replicated).
"""

import functools
import math

import jax
from jax.sharding import PartitionSpec as P

from freeatten_jax.attention import mesh_axes
from freeatten_jax.attention.block_plan import count_visible
from freeatten_jax.attention.pallas import core, plan
from freeatten_jax.attention.pallas.common import Static
from freeatten_jax.attention.platforms import platform_dependent
from freeatten_jax.attention.variants import Mask, Variant, check_positive_int, hide_unseen


def _run(lowering: core.Lowering, cfg: Static, blocks: tuple, q_BTHD, k_BSKD, v_BSKD, qs_BTH1, ks_BSK1, p_1, mask: Mask, n_BT):
    """Pad to whole blocks, lay out as [B, heads, length, D], run the kernels, undo the layout."""
    t, s = q_BTHD.shape[1], k_BSKD.shape[1]
    cfg = core.sized(lowering, cfg, blocks, t, s, q_BTHD.shape[-1])._replace(plain_length=t if mask.plain else None)
    operands, shapes = core.kernel_layout(cfg, q_BTHD, k_BSKD, v_BSKD, qs_BTH1, ks_BSK1)
    out_BHTD = core.single_device_core(cfg, lowering, shapes)(*operands, p_1, plan.plan(mask, n_BT, cfg.blocks.q, cfg.blocks.k))
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
    gpu_kernels="triton",
    split_matmuls=None,
    batch_axes=mesh_axes.BATCH,
    head_axes=mesh_axes.HEADS,
    **unknown,
):
    """o_i = Σ_j A_ij v_j in fused kernels; statistics in float32, matmuls in q's dtype, output in q's dtype.

    block_q, block_k: block lengths (default: the platform's core.LOWERINGS entry). block_k_dkv: the GPU dK/dV
    kernel's key block, a divisor of the key block (default: the key block; the TPU kernels use theirs): fewer
    registers for its accumulators, which spill at 64 keys and D = 128 (benchmarks/RESULTS.md). interpret=True: run
    the GPU kernels in Pallas interpret mode on any platform (CPU always uses it); "tpu": the TPU ones.
    gpu_kernels: the GPU kernels, "triton" (every GPU) or "mosaic_gpu" (Hopper: a Mosaic GPU forward for LSSA on
    plain masks with Triton's backward; a ValueError where it does not apply; `auto` does not choose it yet).
    split_matmuls: True, the float32 weights and score gradients enter their bfloat16 matmuls as two halves
    (common.weighted_dot), for 1.3-1.5x the matmuls; False, they are rounded once to bfloat16, as
    FlashAttention does; None: False but for core.SPLIT_BY_DEFAULT, so that every variant keeps FlashAttention's
    precision contract (docs/method.md: at most 2x the bfloat16 reference's error). batch_axes, head_axes:
    the ambient mesh's axes that shard the batch and the heads (the kernels run per shard). Keys no
    query sees are zeroed first (hide_unseen, as in blockwise); a dense `mask` is refused (the
    kernels read only the structured mask fields)."""
    if unknown:
        raise ValueError(
            f"unknown option(s) {sorted(unknown)}; implementation 'pallas' takes block_q, block_k, block_k_dkv, "
            "interpret, gpu_kernels, split_matmuls, batch_axes, head_axes"
        )
    if mask.dense is not None:
        raise ValueError("implementation 'pallas' does not take a dense `mask`; use 'blockwise' or 'reference'")
    check_positive_int("block_q", block_q)
    check_positive_int("block_k", block_k)
    check_positive_int("block_k_dkv", block_k_dkv)
    core.check_interpret(interpret)
    core.check_gpu_kernels(gpu_kernels)
    n_B1T, seen_B1S = count_visible(mask, 512)
    k_BSKD, v_BSKD = hide_unseen(k_BSKD, v_BSKD, seen_B1S)
    cfg, args = core.kernel_arguments(variant, mask, opts, q_BTHD, k_BSKD, v_BSKD, n_B1T, split_matmuls)
    blocks = (block_q, block_k, block_k_dkv)
    run = lambda name: functools.partial(_run, core.LOWERINGS[name], cfg, blocks)  # noqa: E731
    per_platform = functools.partial(platform_dependent, core.choose_lowering(interpret, gpu_kernels=gpu_kernels), run)
    return _per_shard(per_platform, batch_axes, head_axes)(*args, mask, n_B1T[:, 0])
