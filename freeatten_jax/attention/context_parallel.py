"""Context parallelism: `attend` with the sequence sharded over a mesh axis (ring attention, zig-zag balanced).

Glossary: B batch, T queries, S keys, H heads, K kv heads, D head dim, n the context axis size, c = T / 2n
(a zig-zag chunk). Three steps: (1) N_i of each device's queries over every key, from the key-side mask
arrays all-gathered (int32/bool, B·S each: tiny next to K/V), and which keys some query sees (the others'
keys and values are zeroed before any arithmetic, docs/method.md §8, as in blockwise); (2) the variant's factors
of the scores (`variant.scales`) on the sharded arrays outside shard_map, so autodiff carries SSMax's s, b
gradients as elsewhere; (3) in shard_map: reorder the sequence to zig-zag (device d holds chunks d and 2n-1-d,
so every device does the same causal work), ring attention (the Pallas kernels, pallas/ring.py, or the
blockwise rules, ring.py), and back to the natural order.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from freeatten_jax.attention import arguments, block_plan, blockwise, mesh_axes, ring, ring_mask
from freeatten_jax.attention.pallas import core as kernels
from freeatten_jax.attention.pallas import ring as kernel_ring
from freeatten_jax.attention.platforms import platform_dependent
from freeatten_jax.attention.variants import hide_unseen

STRATEGIES = ("ring", "gather")
# attend's implementation names -> what a ring step runs (the reference has no ring form: blockwise rules)
IMPLEMENTATIONS = {"auto": "auto", "pallas": "pallas", "blockwise": "blockwise", "reference": "blockwise"}


def _holder(chunk: int, size: int) -> int:
    """The device that holds natural chunk `chunk` (of 2n) in the zig-zag order."""
    return chunk if chunk < size else 2 * size - 1 - chunk


def to_zigzag(x, axis_name: str, size: int, axis: int = 1):
    """[B, 2c, ...] holding natural chunks (2d, 2d+1) -> the same shape holding chunks (d, 2n-1-d).

    Inside shard_map; `axis` is the sequence axis. Every device receives one even and one odd chunk: two ppermutes."""
    even, odd = jnp.split(x, 2, axis=axis)
    even = jax.lax.ppermute(even, axis_name, [(d, _holder(2 * d, size)) for d in range(size)])
    odd = jax.lax.ppermute(odd, axis_name, [(d, _holder(2 * d + 1, size)) for d in range(size)])
    even_device = jax.lax.axis_index(axis_name) % 2 == 0  # there chunk d is the even one
    return jnp.where(even_device, jnp.concatenate([even, odd], axis), jnp.concatenate([odd, even], axis))


def from_zigzag(x, axis_name: str, size: int):
    """The inverse of to_zigzag: chunks (d, 2n-1-d) -> natural chunks (2d, 2d+1)."""
    first, second = jnp.split(x, 2, axis=1)
    even_device = jax.lax.axis_index(axis_name) % 2 == 0
    even, odd = jnp.where(even_device, first, second), jnp.where(even_device, second, first)
    zigzag = [(d, 2 * size - 1 - d) for d in range(size)]
    even = jax.lax.ppermute(even, axis_name, [(d, (a if a % 2 == 0 else b) // 2) for d, (a, b) in enumerate(zigzag)])
    odd = jax.lax.ppermute(odd, axis_name, [(d, (b if a % 2 == 0 else a) // 2) for d, (a, b) in enumerate(zigzag)])
    return jnp.concatenate([even, odd], 1)


def _count_visible(mask, *, axis_name: str, block_k: int):
    """N_i of this device's queries over the whole key sequence ([B, 1, T/n]; key-side mask arrays
    all-gathered), and whether any query of the batch row, on any device, sees each of this device's
    keys ([B, 1, S/n]: every device's verdicts on all keys, summed and scattered)."""
    gather = functools.partial(jax.lax.all_gather, axis_name=axis_name, axis=1, tiled=True)
    full = dataclasses.replace(mask, **{name: gather(getattr(mask, name)) for name in ring_mask.KV_FIELDS})
    n_BHT, seen_BHS = block_plan.count_visible(full, block_k)
    seen_BHS = jax.lax.psum_scatter(seen_BHS.astype(jnp.int32), axis_name, scatter_dimension=2, tiled=True) > 0
    return n_BHT, seen_BHS


def _blockwise_ring(q_BTHD, k_BSKD, v_BSKD, qs_BTH1, ks_BSK1, p_1, context, *, core, blocks, key_scale: bool):
    """This device's output by the blockwise rules round the ring (ring.py), the factors folded into q and k."""
    (b, t, h, d), kv_heads = q_BTHD.shape, k_BSKD.shape[2]
    qp_BTHD, kp_BSKD = q_BTHD.astype(jnp.float32) * qs_BTH1, k_BSKD * ks_BSK1 if key_scale else k_BSKD
    q_IBKGQD = blockwise.query_blocks(qp_BTHD, blocks[0], kv_heads)
    kt_JBKDC = blockwise.swap_last(blockwise.key_blocks(kp_BSKD, blocks[1]))
    out_IBKGQD = core(q_IBKGQD, kt_JBKDC, blockwise.key_blocks(v_BSKD, blocks[1]), context)
    return out_IBKGQD.transpose(1, 0, 4, 2, 3, 5).reshape(b, -1, h, d)[:, :t].astype(q_BTHD.dtype)


def _ring_attend(q_BTHD, k_BSKD, v_BSKD, qs_BTH1, ks_BSK1, p_1, mask, n_BHT, *, run, axis_name: str, size: int, gather: bool):
    """Inside shard_map: to zig-zag, `run` round the ring (the kernels or the blockwise rules), back to the
    natural order. gather: all-gather K/V (autodiff reduce-scatters dK/dV) and run a ring of one step instead."""
    zigzag = functools.partial(to_zigzag, axis_name=axis_name, size=size)
    q_BTHD, k_BSKD, v_BSKD, qs_BTH1, ks_BSK1, mask = jax.tree.map(zigzag, (q_BTHD, k_BSKD, v_BSKD, qs_BTH1, ks_BSK1, mask))
    context = ring_mask.Ring.around(mask, zigzag(n_BHT, axis=2), axis_name, size)
    if gather:
        b = q_BTHD.shape[0]
        k_BSKD, v_BSKD, ks_BSK1 = (jax.lax.all_gather(x, axis_name, axis=1, tiled=True) for x in (k_BSKD, v_BSKD, ks_BSK1))
        kv_masks = tuple(x.transpose(1, 0, 2).reshape(1, b, -1) for x in context.kv_masks)  # one chunk: all keys
        context = dataclasses.replace(context, size=1, kv_masks=kv_masks)
    return from_zigzag(run(q_BTHD, k_BSKD, v_BSKD, qs_BTH1, ks_BSK1, p_1, context), axis_name, size)


def _runs(spec, opts, cfg, implementation: str, interpret, blocks, kernel_blocks):
    """The per-device ring `run` for the implementation: the kernels of the platform it runs on (Triton on CUDA,
    Mosaic on TPU; "auto": the blockwise rules on CPU, "pallas": interpret mode there), or the blockwise rules."""
    core = blockwise.make_core(spec, opts, ring.forward, ring.backward)
    rules = functools.partial(_blockwise_ring, core=core, blocks=blocks, key_scale=cfg.key_scale)
    if implementation == "blockwise":
        return rules
    on_the_cpu = kernels.ON_THE_CPU if implementation == "pallas" else "blockwise"

    def run(name: str):
        if name == "blockwise":
            return rules
        return functools.partial(kernel_ring.attend, kernels.LOWERINGS[name], cfg, kernel_blocks)

    return functools.partial(platform_dependent, kernels.choose_lowering(interpret, on_the_cpu), run)


def context_parallel_attend(
    q,
    k,
    v,
    *,
    mesh,
    axis_name: str,
    variant: str,
    causal: bool = True,
    strategy: str = "ring",
    batch_axis=None,
    head_axis=None,
    block_q=None,
    block_k=None,
    implementation: str = "auto",
    interpret=False,
    split_matmuls=None,
    **options,
) -> jax.Array:
    """`attend(q, k, v, ...)` for q, k, v sharded along the sequence over mesh axis `axis_name`.

    strategy: "ring" passes K/V chunks round the axis (O(S/n) K/V per device); "gather" all-gathers them
    (O(S) K/V per device, one collective: worth it when K/V are small, e.g. GQA with few kv heads).
    implementation: what each ring step runs: "pallas" the fused kernels of the platform (Triton on CUDA,
    Mosaic on TPU, interpret mode on CPU), "auto" the kernels on accelerators and the blockwise rules on CPU,
    "blockwise" (or "reference", which has no ring form) the blockwise rules; interpret and split_matmuls as
    in implementation "pallas". batch_axis, head_axis: the mesh axes (or None) that shard the batch and the
    heads. options: attend's variant and mask options. block_q, block_k: the per-device block lengths
    (default: the implementation's). q_len and kv_len must be multiples of 2n (zig-zag chunks): pad and hide
    the padding with kv_mask. A dense `mask` is not supported (it would need its [T, S] tiles sent round the ring).
    """
    spec, mask, opts, rest = arguments.parse(q, k, v, variant, causal, dict(options))
    if rest:
        raise ValueError(f"unknown option(s) {sorted(rest)} for context_parallel_attend")
    if mask.dense is not None:
        raise ValueError(
            "context_parallel_attend does not support a dense mask (option `mask`): "
            "use the structured options (positions, segments, kv_mask, window)"
        )
    mesh_axes.check_mesh(mesh, axis_name, batch_axis, head_axis, q.shape, k.shape)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"unknown implementation {implementation!r}; valid: {', '.join(IMPLEMENTATIONS)}")
    kernels.check_interpret(interpret)
    size = mesh.shape[axis_name]
    for name, length in (("q_len", q.shape[1]), ("kv_len", k.shape[1])):
        if error := mesh_axes.context_length_error(name, length, size, axis_name):
            raise ValueError(f"{error}; pad it and hide the padding with kv_mask")
    blocks = blockwise.block_sizes(q.shape[1] // size, k.shape[1] // size, block_q, block_k)
    rows, tokens = P(batch_axis, axis_name), P(batch_axis, axis_name, head_axis, None)
    counts = P(batch_axis, None, axis_name)  # [B, 1, T] and [B, 1, S]
    # check_vma=False: the ring's loops carry zeros (replicated) into device-varying values; the tests
    # check the gradients, replicated axes included
    shard = functools.partial(jax.shard_map, mesh=mesh, check_vma=False)

    count = functools.partial(_count_visible, axis_name=axis_name, block_k=blocks[1])
    n_BHT, seen_BHS = shard(count, in_specs=(rows,), out_specs=(counts, counts))(mask)
    k, v = hide_unseen(k, v, seen_BHS)  # docs/method.md §8: NaN/Inf in keys no query sees reach nothing
    # the variant's factors outside shard_map, so autodiff carries their gradients (e.g. to SSMax's s, b)
    cfg, args = kernels.kernel_arguments(spec, mask, opts, q, k, v, n_BHT, split_matmuls)
    run = _runs(spec, opts, cfg, IMPLEMENTATIONS[implementation], interpret, blocks, (block_q, block_k, None))
    local = functools.partial(_ring_attend, run=run, axis_name=axis_name, size=size, gather=strategy == "gather")
    local = shard(local, in_specs=(tokens,) * 5 + (P(), rows, counts), out_specs=tokens)
    return local(*args, mask, n_BHT)
