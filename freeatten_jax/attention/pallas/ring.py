"""Ring attention on the Pallas kernels: each ring step runs the platform's kernels on this device's queries
against the K/V chunk it holds (context_parallel.py; the blockwise ring is attention/ring.py).

Glossary: B batch, H heads, K kv heads, D head dim, Tp / Sp this device's query / key lengths padded to whole
blocks, I / Q the number / length of query blocks, n the ring size. Forward: each of the family's passes
(rules.FAMILIES) is a pass kernel that continues a float32 carry (row statistics lane-dense [B, H, I, 1, Q],
accumulators [B, H, Tp, D]) over the chunk held, n steps round the ring; the pass's `finish` (elementwise over
rows) runs here between passes, so LSSAR's threshold sees Z_i over every key; its rows stay lane-dense. Backward:
the dq and dkv kernels against the chunk held, dK/dV travelling with K/V as in attention/ring.py. q, k, v, dout,
the accumulators and the sums are packed once, before the ring (core.packed: a TPU's 128 lanes, not half padding,
at D = 64), and unpacked after it. core.make_core gives the custom VJP and the factors' gradients.
"""

import jax
import jax.numpy as jnp

from freeatten_jax.attention.pallas import core, plan
from freeatten_jax.attention.pallas.common import Static, fresh_carry, kernel_ctx, kernel_family, split_output
from freeatten_jax.attention.ring_mask import Ring, rotate


def _lane_dense(x_BHTW, size: int):
    """A row statistic [B, H, Tp, 1] as the pass kernels and the backward read it, lane-dense [B, H, I, 1, Q] (a
    [.., Tp, 1] float32 array is padded 128x on a TPU: 384 MiB a statistic at 65,536 tokens a chip); [B, H, Tp, D] as it is."""
    return core.by_blocks(x_BHTW, size) if x_BHTW.shape[-1] == 1 else x_BHTW


def _from_carry(cfg: Static, x):
    """A carry leaf as the pass kernels leave it (a row statistic lane-dense, an accumulator packed) as [B, H, Tp, 1]
    or [B, H, Tp, D]."""
    return x.reshape(*x.shape[:2], -1, 1) if x.ndim == 5 else core.unpacked(cfg, x, cfg.blocks.q)


def _core(cfg: Static, lowering: core.Lowering, shapes):
    """make_core's forward and backward streaming the chunks round the ring (`where` a Ring)."""
    _, dq_call, dkv_call = lowering.calls(cfg, shapes)

    def plan_at(ring: Ring, step):
        return plan.plan(ring.mask_at(step), ring.n_BHT[:, 0], cfg.blocks.q, cfg.blocks.k)

    def forward_for(cfg: Static):
        def run_forward(q, k, v, qs, ks, p_1, ring: Ring):
            q, k, v = core.packed_operands(cfg, q, k, v)
            n = plan_at(ring, 0).n_col[:, None]  # [B, 1, Tp, 1]
            ctx = kernel_ctx(cfg, n, p_1[0])  # its finishes read only n
            out, rows = None, dict[str, jax.Array]()
            for which, one in enumerate(kernel_family(cfg).passes):
                calls = {fresh: lowering.pass_call(cfg, shapes, which, tuple(rows), fresh) for fresh in (True, False)}
                tree = jax.tree.structure(fresh_carry(one, 1, 1))
                travelling = (k, ks, v) if one.with_values else (k, ks)  # LSSAR's first pass reads no values

                row_values = tuple(rows.values())

                def ring_step(step, state, calls=calls, rows=row_values):
                    leaves, held = state
                    passed_on = rotate(held, ring.axis_name, ring.size)  # issued first: it can overlap the work
                    k_held, ks_held, v_held = (*held, v)[:3]  # a pass that reads no values gets the local ones
                    step_plan = plan_at(ring, step)
                    leaves = calls[not leaves](  # the first step starts the carry in the kernel: no zeros in HBM
                        *core.kernel_inputs(step_plan, p_1, q, k_held, v_held, qs, ks_held, rows=rows, carry=tuple(leaves))
                    )
                    return list(leaves), passed_on

                # the first step's rotation issued once q is ready, so it overlaps that step's kernel (ready earlier, a
                # TPU's scheduler ran the key factors' among the layer's other permutes and waited for it)
                local = jax.lax.optimization_barrier((travelling, q))[0]
                leaves, _ = jax.lax.fori_loop(1, ring.size, ring_step, ring_step(0, ([], local)))
                out, new = one.finish(jax.tree.unflatten(tree, [_from_carry(cfg, x) for x in leaves]), ctx)
                rows = {**rows, **{name: _lane_dense(x, cfg.blocks.q) for name, x in new.items()}}
            return *split_output(cfg, out), rows

        return run_forward

    def run_backward(q, k, v, qs, ks, p_1, ring: Ring, rows, dout):
        q, k, v, dout = core.packed_operands(cfg, q, k, v, dout)

        def ring_step(step, state):
            dq_sum, held, dk_sum, dv, dpow = state
            passed_on = rotate(held, ring.axis_name, ring.size)
            (k_held, v_held, ks_held), step_plan = held, plan_at(ring, step)
            grads = core.kernel_backward(cfg, dq_call, dkv_call, q, k_held, v_held, qs, ks_held, p_1, step_plan, rows, dout)
            dq_r, dk_r, dv_r, dp_r = grads
            dk_sum, dv = rotate((dk_sum + dk_r, dv + dv_r), ring.axis_name, ring.size)  # home after n steps
            return dq_sum + dq_r, passed_on, dk_sum, dv, dpow + (0.0 if dp_r is None else jnp.sum(dp_r))

        dq_sum, dk_sum, dv = (jnp.zeros(x.shape, jnp.float32) for x in (q, k, v))
        state = (dq_sum, (k, v, ks), dk_sum, dv, jnp.float32(0.0))
        dq_sum, _, dk_sum, dv, dpow = jax.lax.fori_loop(0, ring.size, ring_step, state)
        return *core.unpacked_sums(cfg, dq_sum, dk_sum, dv), dpow

    return core.make_core(cfg, forward_for, run_backward)


def attend(lowering: core.Lowering, cfg: Static, blocks: tuple, q_BTHD, k_BSKD, v_BSKD, qs_BTH1, ks_BSK1, p_1, ring: Ring):
    """Inside shard_map: this device's output [B, T/n, H, D] by the kernels round the ring (arguments as
    core.kernel_arguments gives them, sharded along the sequence; `blocks` the requested (block_q, block_k,
    block_k_dkv), None: the platform's)."""
    t, s = q_BTHD.shape[1], k_BSKD.shape[1]
    cfg = core.sized(lowering, cfg, blocks, t, s, q_BTHD.shape[-1])
    operands, shapes = core.kernel_layout(cfg, q_BTHD, k_BSKD, v_BSKD, qs_BTH1, ks_BSK1)
    out_BHTD = _core(cfg, lowering, shapes)(*operands, p_1, ring)
    return out_BHTD[:, :, :t].transpose(0, 2, 1, 3)
