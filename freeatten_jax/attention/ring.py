"""Ring attention inside shard_map: the blockwise rules streamed over K/V chunks passed round a mesh axis.

Glossary: as blockwise.py (B batch, K kv heads, G = H // K, D head dim, I / J query / key blocks of the
local chunk, Q / C their lengths); n the ring (context axis) size. Each device keeps its queries and
sends its K/V chunk round the ring: at step r it holds the chunk of the device r places before it.
Forward: the rule's per-row carry ([I, ...], O(T/n) per device) persists over the n steps, so each
rule's `step` runs unchanged and its `finish` sees statistics over every key (LSSAR's pass-1 Z_i: two
trips round the ring). Backward: K, V travel with their gradient accumulators dK, dV, which are home
after n steps; only the output and per-row statistics are saved. `forward` and `backward` have
blockwise's signatures (a Ring where blockwise takes a Plan): blockwise.make_core wraps them in its custom VJP.
"""

import functools

import jax
import jax.numpy as jnp

from freeatten_jax.attention import blockwise
from freeatten_jax.attention.ring_mask import Ring, rotate


def _plan(ring: Ring, step, q_size: int, kv_size: int, kv_heads: int) -> blockwise.Plan:
    """The block plan of this device's queries against the chunk it holds at ring step `step`."""
    return blockwise.make_plan(ring.mask_at(step), ring.n_BHT, q_size, kv_size, kv_heads)


def forward(rule, cfg, q_IBKGQD, kt_JBKDC, v_JBKCD, ring: Ring):
    """The rule's output [I, B, K, G, Q, D] and per-row statistics, with K/V going once round the ring per sweep."""
    sizes = q_IBKGQD.shape[-2], kt_JBKDC.shape[-1], kt_JBKDC.shape[2]  # Q, C, K
    index_I = jnp.arange(q_IBKGQD.shape[0])
    n_IBKGQ1 = _plan(ring, 0, *sizes).n_IBKGQ1

    def sweep(init, step, finish, rows_I=None):
        row0 = jnp.zeros((*q_IBKGQD.shape[1:-1], 1), jnp.float32)
        acc0 = jnp.zeros((*q_IBKGQD.shape[1:-1], v_JBKCD.shape[-1]), jnp.float32)
        carry_I = jax.lax.map(lambda i: init(row0, acc0, blockwise.take(rows_I, i)), index_I)

        def ring_step(r, state):
            carry_I, kt_JBKDC, v_JBKCD = state
            passed_on = rotate((kt_JBKDC, v_JBKCD), ring.axis_name, ring.size)  # issued first: it can overlap the work
            plan = _plan(ring, r, *sizes)

            def per_query_block(xs):
                i, q_BKGQD, n, rows, carry = xs

                def visit(j, carry):
                    scores_BKGQC = blockwise.block_scores(q_BKGQD, kt_JBKDC[j])
                    return step(carry, scores_BKGQC, blockwise.block_visible(plan, i, j, q_BKGQD.shape[1]), v_JBKCD[j], n, rows)

                def body(j, carry):
                    return jax.lax.cond(plan.maybe_IJ[i, j], functools.partial(visit, j), lambda c: c, carry)

                return jax.lax.fori_loop(plan.k_first_I[i], plan.k_end_I[i], body, carry)

            carry_I = jax.lax.map(per_query_block, (index_I, q_IBKGQD, n_IBKGQ1, rows_I, carry_I))
            return (carry_I, *passed_on)

        carry_I, _, _ = jax.lax.fori_loop(0, ring.size, ring_step, (carry_I, kt_JBKDC, v_JBKCD))
        return jax.lax.map(lambda xs: finish(*xs), (carry_I, n_IBKGQ1))

    return rule.forward(sweep, cfg)


def backward(rule, cfg, q_IBKGQD, kt_JBKDC, v_JBKCD, ring: Ring, rows_I, dout_IBKGQD):
    """dq, dk^T, dv, dp: each ring step is blockwise's backward against the chunk held, dK/dV riding along
    (dp, LSSAR's power, sums this device's queries; shard_map's transpose sums it over the devices)."""
    sizes = q_IBKGQD.shape[-2], kt_JBKDC.shape[-1], kt_JBKDC.shape[2]

    def ring_step(r, state):
        dq_IBKGQD, kt_JBKDC, v_JBKCD, dkt_JBKDC, dv_JBKCD, dpow = state
        passed_on = rotate((kt_JBKDC, v_JBKCD), ring.axis_name, ring.size)
        dq, dkt, dv, dp = blockwise.backward(rule, cfg, q_IBKGQD, kt_JBKDC, v_JBKCD, _plan(ring, r, *sizes), rows_I, dout_IBKGQD)
        dkt_JBKDC, dv_JBKCD = rotate((dkt_JBKDC + dkt, dv_JBKCD + dv), ring.axis_name, ring.size)
        return dq_IBKGQD + dq, *passed_on, dkt_JBKDC, dv_JBKCD, dpow + dp

    zeros = [jnp.zeros_like(x) for x in (q_IBKGQD, kt_JBKDC, v_JBKCD)]
    state = jax.lax.fori_loop(0, ring.size, ring_step, (zeros[0], kt_JBKDC, v_JBKCD, zeros[1], zeros[2], jnp.float32(0.0)))
    return state[0], state[3], state[4], state[5]
