"""Memory-efficient attention for every variant (docs/method.md §3): O(T) memory, custom VJP, block skipping.

Glossary: B batch, T queries, S keys, H heads, K kv heads, G = H // K, D head dim, Q / C query /
key block length, I / J number of query / key blocks. Forward: for each query block, stream the
key blocks that may be visible (a rule per normalise kind: rules.FAMILIES in blockwise_rules' layout). Backward: for
each key block, stream the query blocks, recomputing scores; only the output and per-row
statistics are saved. `prepare` runs outside the custom VJP, so autodiff carries its gradients.
Public pieces (ring.py builds its ring attention from them): block_sizes, query_blocks, key_blocks,
swap_last, make_plan, block_scores, block_visible, take, forward, backward, make_core (and, for sharded_decode.py,
attend_blocks).
"""

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from freeatten_jax.attention import block_plan, rules
from freeatten_jax.attention.blockwise_rules import RULES, Config, Rule
from freeatten_jax.attention.variants import Mask, Variant, check_positive_int, hide_unseen

_HIGHEST = jax.lax.Precision.HIGHEST
# Default (query, key) block sizes. CPU: measured with benchmarks/attention.py (256 x 128 was best or
# tied at T = 2048 and 4096); GPU/TPU: not measured here, large blocks keep loop overhead low.
BLOCKS = {"cpu": (256, 128), "gpu": (512, 1024), "tpu": (512, 1024)}


class Plan(NamedTuple):
    """The blocked mask and which (query block, key block) pairs may hold a visible pair."""

    q_mask: Mask  # arrays [I, B, Q]
    kv_mask: Mask  # arrays [J, B, C]; a dense mask as [J, B or 1, H or 1, I·Q, C]
    n_IBKGQ1: jax.Array  # N_i as float32 (K = G = 1 unless the dense mask is per head)
    maybe_IJ: jax.Array  # bool: False only where the block is provably invisible
    k_first_I: jax.Array  # first and one-past-last key block that query block i may see
    k_end_I: jax.Array
    q_first_J: jax.Array  # first and one-past-last query block that may see key block j
    q_end_J: jax.Array


def _pair(q_mask: Mask, kv_mask: Mask, i, j) -> Mask:
    """The mask of query block i against key block j ([B, H or 1, Q, C] when visible() is called)."""
    size = q_mask.q_positions.shape[-1]
    dense = None if kv_mask.dense is None else jax.lax.dynamic_slice_in_dim(kv_mask.dense[j], i * size, size, axis=2)
    return dataclasses.replace(
        q_mask,
        q_positions=q_mask.q_positions[i],
        q_segment_ids=q_mask.q_segment_ids[i],
        kv_positions=kv_mask.kv_positions[j],
        kv_segment_ids=kv_mask.kv_segment_ids[j],
        kv_valid=kv_mask.kv_valid[j],
        dense=dense,
    )


def _maybe_visible(q_mask: Mask, kv_mask: Mask) -> jax.Array:
    """[I, J] bool; False only where block_plan rules out every pair in every batch row (and the dense
    mask, if any, in every row and head)."""
    arrays_XBY = (q_mask.q_positions, q_mask.q_segment_ids, kv_mask.kv_positions, kv_mask.kv_segment_ids, kv_mask.kv_valid)
    maybe_BIJ = block_plan.maybe_visible(q_mask, *(x.transpose(1, 0, 2) for x in arrays_XBY))
    maybe = jnp.any(maybe_BIJ, axis=0)
    if kv_mask.dense is not None:
        j, b, h, t, c = kv_mask.dense.shape
        maybe &= jnp.any(kv_mask.dense.reshape(j, b, h, -1, q_mask.q_positions.shape[-1], c), axis=(1, 2, 4, 5)).T
    return maybe


def _span(maybe_XY):
    """First and one-past-last True along Y for each X (0, 0 where none)."""
    size = maybe_XY.shape[1]
    first = jnp.argmax(maybe_XY, axis=1)
    end = size - jnp.argmax(maybe_XY[:, ::-1], axis=1)
    anything = jnp.any(maybe_XY, axis=1)
    return jnp.where(anything, first, 0), jnp.where(anything, end, 0)


def _split_heads(x, axis: int, kv_heads: int):
    """Split a head axis of size H into (K, G), or a size-1 head axis into (1, 1)."""
    h = x.shape[axis]
    groups = kv_heads if h > 1 else 1
    return x.reshape(*x.shape[:axis], groups, h // groups, *x.shape[axis + 1 :])


def make_plan(mask: Mask, n_BHT, q_size: int, kv_size: int, kv_heads: int) -> Plan:
    """The Plan of the mask's queries in blocks of q_size against its keys in blocks of kv_size."""
    q_mask, kv_mask = block_plan.q_mask_blocks(mask, q_size), block_plan.kv_mask_blocks(mask, kv_size, q_size)
    maybe_IJ = _maybe_visible(q_mask, kv_mask)
    b, h, t = n_BHT.shape
    n_IBHQ = jnp.pad(n_BHT, ((0, 0), (0, 0), (0, -t % q_size))).reshape(b, h, -1, q_size).transpose(2, 0, 1, 3)
    n_IBKGQ1 = _split_heads(n_IBHQ.astype(jnp.float32), 2, kv_heads)[..., None]
    return Plan(q_mask, kv_mask, n_IBKGQ1, maybe_IJ, *_span(maybe_IJ), *_span(maybe_IJ.T))


def block_scores(q_BKGQD, kt_BKDC):
    """The scores of one query block against one key block, [B, K, G, Q, C]."""
    return jnp.einsum("BKGQD,BKDC->BKGQC", q_BKGQD, kt_BKDC, precision=_HIGHEST)


def block_visible(plan: Plan, i, j, kv_heads: int):
    """M for query block i and key block j as [B, K, G, Q, C] (K = G = 1 unless per head)."""
    return _split_heads(_pair(plan.q_mask, plan.kv_mask, i, j).visible(), 1, kv_heads)


def take(tree, i):
    """Entry i of every array of a tree (a query block's per-row statistics)."""
    return jax.tree.map(lambda x: x[i], tree)


def forward(rule, cfg: Config, q_IBKGQD, kt_JBKDC, v_JBKCD, plan: Plan):
    """The rule's output [I, B, K, G, Q, D] and per-row statistics (each [I, B, K, G, Q, 1])."""
    shape_BKGQ = q_IBKGQD.shape[1:-1]

    def sweep(init, step, finish, rows_I=None):
        def per_query_block(xs):
            i, q_BKGQD, n, rows = xs

            def visit(j, carry):
                scores_BKGQC = block_scores(q_BKGQD, kt_JBKDC[j])
                return step(carry, scores_BKGQC, block_visible(plan, i, j, q_BKGQD.shape[1]), v_JBKCD[j], n, rows)

            def body(j, carry):
                return jax.lax.cond(plan.maybe_IJ[i, j], functools.partial(visit, j), lambda c: c, carry)

            row0 = jnp.zeros((*shape_BKGQ, 1), jnp.float32)
            acc0 = jnp.zeros((*shape_BKGQ, v_JBKCD.shape[-1]), jnp.float32)
            carry = jax.lax.fori_loop(plan.k_first_I[i], plan.k_end_I[i], body, init(row0, acc0, rows))
            return finish(carry, n)

        index_I = jnp.arange(q_IBKGQD.shape[0])
        return jax.lax.map(per_query_block, (index_I, q_IBKGQD, plan.n_IBKGQ1, rows_I))

    return rule.forward(sweep, cfg)


def swap_last(x):
    """Swap the last two axes ([.., Q, D] <-> [.., D, Q]): every matmul below then needs no transpose."""
    return jnp.swapaxes(x, -1, -2)


def backward(rule, cfg: Config, q_IBKGQD, kt_JBKDC, v_JBKCD, plan: Plan, rows_I, dout_IBKGQD):
    """dq, dk^T, dv, dp (LSSAR's power, a scalar; 0 unless cfg.p_grad) by streaming query blocks per key
    block, recomputing each block's scores."""
    qt_IBKDGQ, dout_t_IBKDGQ = (jnp.moveaxis(x, -1, -3) for x in (q_IBKGQD, dout_IBKGQD))
    power_grad = rule.power_grad_block if cfg.p_grad else None

    def per_key_block(carry, xs):
        dq_IBKGQD, dpow = carry
        j, kt_BKDC, k_BKCD, vt_BKDC = xs

        def visit(i, carry):
            dkt_BKDC, dvt_BKDC, dq_IBKGQD, dpow = carry
            dp_BKGQC = jnp.einsum("BKGQD,BKDC->BKGQC", dout_IBKGQD[i], vt_BKDC, precision=_HIGHEST)
            scores_BKGQC = block_scores(q_IBKGQD[i], kt_BKDC)
            visible = block_visible(plan, i, j, k_BKCD.shape[1])
            args = (scores_BKGQC, visible, plan.n_IBKGQ1[i], take(rows_I, i), dp_BKGQC, cfg)
            w_BKGQC, ds_BKGQC = rule.grad_block(*args)
            dvt_BKDC += jnp.einsum("BKDGQ,BKGQC->BKDC", dout_t_IBKDGQ[i], w_BKGQC, precision=_HIGHEST)
            dkt_BKDC += jnp.einsum("BKDGQ,BKGQC->BKDC", qt_IBKDGQ[i], ds_BKGQC, precision=_HIGHEST)
            dq_BKGQD = jnp.einsum("BKGQC,BKCD->BKGQD", ds_BKGQC, k_BKCD, precision=_HIGHEST)
            if power_grad is not None:
                dpow += jnp.sum(power_grad(*args))
            return dkt_BKDC, dvt_BKDC, dq_IBKGQD.at[i].add(dq_BKGQD), dpow

        def body(i, carry):
            return jax.lax.cond(plan.maybe_IJ[i, j], functools.partial(visit, i), lambda c: c, carry)

        carry = (jnp.zeros_like(kt_BKDC), jnp.zeros_like(vt_BKDC), dq_IBKGQD, dpow)
        dkt_BKDC, dvt_BKDC, dq_IBKGQD, dpow = jax.lax.fori_loop(plan.q_first_J[j], plan.q_end_J[j], body, carry)
        return (dq_IBKGQD, dpow), (dkt_BKDC, dvt_BKDC)

    index_J = jnp.arange(kt_JBKDC.shape[0])
    xs = (index_J, kt_JBKDC, swap_last(kt_JBKDC), swap_last(v_JBKCD))
    (dq_IBKGQD, dpow), (dkt_JBKDC, dvt_JBKDC) = jax.lax.scan(per_key_block, (jnp.zeros_like(q_IBKGQD), jnp.float32(0.0)), xs)
    return dq_IBKGQD, dkt_JBKDC, swap_last(dvt_JBKDC), dpow


def make_core(variant: Variant, opts, forward=forward, backward=backward):
    """core(q_IBKGQD, kt_JBKDC, v_JBKCD, where) -> out_IBKGQD: the variant's rule with a custom VJP that
    saves only the output and per-row statistics. `forward` and `backward` stream the key blocks of
    `where`: this module's pair for a Plan; ring.py passes its own for a Ring (K/V round a mesh axis)."""
    kind, p = variant.rule(opts), opts.get("p")
    p_grad = kind == "reweight" and isinstance(p, jax.Array)  # a Python number is a constant
    rule, cfg_static = RULES[kind], Config(weight=variant.weight, p=None, static_power=rules.static_power(p), p_grad=p_grad)
    p_arg = jnp.asarray(0.0 if p is None else p, jnp.float32)

    output_rule = Rule(rules.output_only(rule.family))  # without a gradient: the output's passes alone

    @jax.custom_vjp
    def core(q, kt, v, p, where):
        return forward(output_rule, cfg_static._replace(p=p), q, kt, v, where)[0]

    def core_fwd(q, kt, v, p, where):
        out, rows = forward(rule, cfg_static._replace(p=p), q, kt, v, where)
        return out, (q, kt, v, p, where, out, rows)

    def core_bwd(residuals, dout):
        q, kt, v, p, where, out, rows = residuals
        cfg = cfg_static._replace(p=p)
        rows_I = rule.backward_rows(rows, out, dout, cfg)
        dq, dkt, dv, dp = backward(rule, cfg, q, kt, v, where, rows_I, dout)
        return dq, dkt, dv, dp, None

    core.defvjp(core_fwd, core_bwd)
    return lambda q_IBKGQD, kt_JBKDC, v_JBKCD, where: core(q_IBKGQD, kt_JBKDC, v_JBKCD, p_arg, where)


def block_sizes(q_len: int, kv_len: int, block_q=None, block_k=None) -> tuple[int, int]:
    """The (query, key) block lengths: near block_q, block_k (default BLOCKS for the platform), each
    splitting its length into equal blocks with little padding."""
    check_positive_int("block_q", block_q)
    check_positive_int("block_k", block_k)
    default_q, default_k = BLOCKS.get(jax.default_backend(), BLOCKS["gpu"])
    return _block_size(q_len, block_q or default_q), _block_size(kv_len, block_k or default_k)


def _block_size(length: int, block: int) -> int:
    count = math.ceil(length / block)
    return min(block, -(-math.ceil(length / count) // 8) * 8)


def query_blocks(x_BTHD, size: int, kv_heads: int):
    """[B, T, H, D] -> [I, B, K, G, Q, D], zero-padding T to a multiple of `size`."""
    b, t, h, d = x_BTHD.shape
    x_BTHD = jnp.pad(x_BTHD, ((0, 0), (0, -t % size), (0, 0), (0, 0)))
    return x_BTHD.reshape(b, -1, size, kv_heads, h // kv_heads, d).transpose(1, 0, 3, 4, 2, 5)


def key_blocks(x_BSKD, size: int):
    """[B, S, K, D] -> [J, B, K, C, D] in float32, zero-padding S to a multiple of `size`."""
    b, s, kv_heads, d = x_BSKD.shape
    x_BSKD = jnp.pad(x_BSKD.astype(jnp.float32), ((0, 0), (0, -s % size), (0, 0), (0, 0)))
    return x_BSKD.reshape(b, -1, size, kv_heads, d).transpose(1, 0, 3, 2, 4)


def attend(q_BTHD, k_BSKD, v_BSKD, *, variant: Variant, mask: Mask, opts, block_q=None, block_k=None, **unknown):
    """o_i = Σ_j A_ij v_j without a T x S array; float32 math, output in q's dtype.

    block_q, block_k: query and key block lengths (default BLOCKS for the platform).
    A dense mask is read one (query block, key block) tile at a time; without one, memory is O(T)."""
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)}; implementation 'blockwise' takes block_q, block_k")
    sizes = block_sizes(q_BTHD.shape[1], k_BSKD.shape[1], block_q, block_k)
    return attend_blocks(q_BTHD, k_BSKD, v_BSKD, variant, mask, opts, sizes, make_core(variant, opts))


def attend_blocks(q_BTHD, k_BSKD, v_BSKD, variant: Variant, mask: Mask, opts, sizes, core, counted=lambda n_BHT: n_BHT):
    """attend's work in blocks of `sizes` (query, key) by `core` (make_core's); `counted` turns the N_i of these keys
    into the N_i the scores use (a KV cache sharded over a mesh axis sums it over the shards: sharded_decode.py)."""
    (b, t, h, d), kv_heads = q_BTHD.shape, k_BSKD.shape[2]
    q_size, kv_size = sizes
    n_BHT, seen_BHS = block_plan.count_visible(mask, kv_size)
    n_BHT = counted(n_BHT)
    k_BSKD, v_BSKD = hide_unseen(k_BSKD, v_BSKD, seen_BHS)
    qp_BTHD, kp_BSKD = variant.prepare(q_BTHD, k_BSKD, n_BHT, opts)
    q_IBKGQD, kt_JBKDC = query_blocks(qp_BTHD, q_size, kv_heads), swap_last(key_blocks(kp_BSKD, kv_size))
    plan = make_plan(mask, n_BHT, q_size, kv_size, kv_heads)
    out_IBKGQD = core(q_IBKGQD, kt_JBKDC, key_blocks(v_BSKD, kv_size), plan)
    out_BTHD = out_IBKGQD.transpose(1, 0, 4, 2, 3, 5).reshape(b, -1, h, d)[:, :t]
    return out_BTHD.astype(q_BTHD.dtype)
