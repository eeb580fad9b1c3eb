"""Decoding against a KV cache sharded over a mesh axis: each device attends to its own slots, the row statistics
merge across the axis (docs/method.md §3).

Glossary: B batch, T new queries (1 in a decoding step), S cache slots, H query heads, K kv heads, D head dim,
n the axis size. The queries are whole on every device, the keys and values split into n contiguous shards of
S/n slots. N_i is counted on each shard and summed; then every pass of the variant's family (rules.FAMILIES)
folds this device's keys by blockwise's sweep and merges its carry across the axis by the pass's `merge`
(psum and pmax) before its finish: LSSAR's Z_i and u_max first (its θ_i needs the whole row), then the
re-weighted sums; softmax's running max, then its rescaled sums. Decoding only: no gradient.
"""

import dataclasses
import functools

import jax
from jax.sharding import PartitionSpec as P

from freeatten_jax.attention import arguments, blockwise, mesh_axes
from freeatten_jax.attention.blockwise_rules import Rule
from freeatten_jax.attention.ring_mask import KV_FIELDS
from freeatten_jax.attention.rules import Family


def _across(family: Family, axis_name: str) -> Family:
    """The family with each pass's carry merged over the axis before its finish."""
    total, top = (functools.partial(reduce, axis_name=axis_name) for reduce in (jax.lax.psum, jax.lax.pmax))
    finish = lambda one: lambda carry, ctx: one.finish(one.merge(carry, total, top), ctx)  # noqa: E731
    return family._replace(passes=tuple(one._replace(finish=finish(one)) for one in family.passes))


def _forward(axis_name: str, rule: Rule, cfg, q_IBKGQD, kt_JBKDC, v_JBKCD, plan):
    """blockwise.forward over this device's slots, every pass merged across the axis."""
    return blockwise.forward(Rule(_across(rule.family, axis_name)), cfg, q_IBKGQD, kt_JBKDC, v_JBKCD, plan)


def _no_gradient(*_):
    raise ValueError("sharded_decode_attend has no gradient (decoding only): train with context_parallel_attend")


def sharded_decode_attend(
    q, k, v, *, mesh, axis_name: str, variant: str, causal: bool = True, batch_axis=None, head_axis=None, block_k=None, **options
) -> jax.Array:
    """`attend(q, k, v, ...)` (blockwise rules) for k and v split over mesh axis `axis_name` along the sequence in
    contiguous shards (a KV cache), q whole on every device: each device reads only its S/n slots.

    batch_axis, head_axis: the mesh axes (or None) that shard the batch and the heads (kv heads alike). options:
    attend's variant and mask options (not a dense `mask`). block_k: the key block length on each device.
    kv_len must be a multiple of the axis size."""
    spec, mask, opts, rest = arguments.parse(q, k, v, variant, causal, dict(options))
    if rest:
        raise ValueError(f"unknown option(s) {sorted(rest)} for sharded_decode_attend; it takes block_k")
    if mask.dense is not None:
        raise ValueError("sharded_decode_attend does not support a dense mask (option `mask`): use the structured options")
    mesh_axes.check_mesh(mesh, axis_name, batch_axis, head_axis, q.shape, k.shape)
    size = mesh.shape[axis_name]
    if k.shape[1] % size:
        raise ValueError(
            f"kv_len {k.shape[1]} must be a multiple of the {axis_name!r} axis size ({size}): pad it (kv_mask hides it)"
        )
    sizes = blockwise.block_sizes(q.shape[1], k.shape[1] // size, None, block_k)
    core = blockwise.make_core(spec, opts, functools.partial(_forward, axis_name), _no_gradient)
    counted = functools.partial(jax.lax.psum, axis_name=axis_name)
    local = functools.partial(blockwise.attend_blocks, variant=spec, opts=opts, sizes=sizes, core=core, counted=counted)
    queries, keys = P(batch_axis, None, head_axis, None), P(batch_axis, axis_name, head_axis, None)
    q_side, kv_side = P(batch_axis, None), P(batch_axis, axis_name)
    mask = dataclasses.replace(mask, plain=False)  # a shard's keys are not positions 0.. even where all keys are
    mask_specs = jax.tree_util.tree_map_with_path(lambda path, _: kv_side if path[0].name in KV_FIELDS else q_side, mask)
    # check_vma=False: blockwise's loops carry zeros (replicated) into device-varying values, as in the ring
    shard = jax.shard_map(
        lambda q, k, v, mask: local(q, k, v, mask=mask),
        mesh=mesh,
        in_specs=(queries, keys, keys, mask_specs),
        out_specs=queries,
        check_vma=False,
    )
    return shard(q, k, v, mask)
