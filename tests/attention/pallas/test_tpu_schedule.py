"""The TPU kernels' schedules (attention/tpu_schedule.py): every grid row visits its outer blocks' spans in order,
once per pass and minor step, its idle tail fetches nothing new, a plain causal mask's spans are the ones the
run-time plan computes, and its folded schedule has no empty grid step.

Glossary: O / N outer / inner blocks, R grid rows, L steps a row, T tokens, Q / C query / key block length.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import walk_eqns

from freeatten_jax import attention
from freeatten_jax.attention.arguments import make_mask
from freeatten_jax.attention.pallas import plan as pallas_plan
from freeatten_jax.attention.pallas import tpu_schedule

GEOMETRIES = [(37, 16, 8), (40, 8, 16), (8192, 512, 512), (1000, 256, 128)]  # (T, Q, C)


def _causal(t, q, c, key_major, passes=1, minor=1):
    """The schedule of a plain causal mask's query-major (or key-major) kernel."""
    blocks = (c, q) if key_major else (q, c)
    outer, inner = (-(-t // blocks[0]), -(-t // blocks[1]))
    return tpu_schedule.Schedule(outer, inner, passes, minor, tpu_schedule.Causal(t, *blocks, key_major))


def _walk(plan: tpu_schedule.Schedule):
    """Every grid step's Step fields as numpy [R, L] arrays (locate, vectorised over the grid)."""
    r_RL, t_RL = np.meshgrid(np.arange(plan.rows), np.arange(plan.steps), indexing="ij")
    step = tpu_schedule.locate(plan, jnp.asarray(r_RL), jnp.asarray(t_RL))
    return {name: np.broadcast_to(np.asarray(x), r_RL.shape) for name, x in step._asdict().items()}


@pytest.mark.parametrize("passes, minor", [(2, 1), (1, 3)])
@pytest.mark.parametrize("t, q, c", GEOMETRIES)
@pytest.mark.parametrize("key_major", [False, True])
@pytest.mark.parametrize("spans", ["causal", "every"])
def test_each_outer_block_sweeps_its_span_in_order_once_and_idle_steps_hold_the_last(spans, t, q, c, key_major, passes, minor):
    plan = _causal(t, q, c, key_major, passes, minor)
    if spans == "every":
        plan = tpu_schedule.every_block(plan.outer, plan.inner, passes, minor)
    lo, n = plan.span(np.arange(plan.outer), np)
    lo, n = np.broadcast_to(lo, (plan.outer,)), np.broadcast_to(n, (plan.outer,))
    steps = _walk(plan)
    for row in range(plan.rows):
        fields = {name: x[row] for name, x in steps.items()}
        valid = fields["valid"]
        count = int(valid.sum())
        assert valid[:count].all() and not valid[count:].any(), "the idle steps are a row's tail"
        visits = list(zip(*(fields[name][:count].tolist() for name in ("outer", "which", "inner", "minor"))))
        outers = dict.fromkeys(fields["outer"][:count].tolist())  # in order of first visit
        expected = [(o, p, lo[o] + j, m) for o in outers for p in range(passes) for j in range(n[o]) for m in range(minor)]
        assert visits == expected
        starts = [x[2] == lo[x[0]] and x[3] == 0 for x in visits]
        ends = [x[2] == lo[x[0]] + n[x[0]] - 1 and x[3] == minor - 1 for x in visits]
        assert fields["first"][:count].tolist() == starts and fields["last"][:count].tolist() == ends
        assert not fields["first"][count:].any() and not fields["last"][count:].any()
        for name in ("outer", "which", "inner", "minor"):  # an idle step repeats the last block indices: no fetch
            assert (fields[name][count:] == fields[name][count - 1]).all()
    outers = steps["outer"][steps["valid"]]
    assert sorted(set(outers.tolist())) == list(range(plan.outer)), "every outer block in some row"
    assert np.sum(steps["valid"]) == passes * minor * int(n.sum())


def test_causal_spans_are_the_plans_for_a_plain_mask():
    plan = jax.jit(pallas_plan.plan, static_argnums=(2, 3))
    for t, q, c in GEOMETRIES:
        mask = make_mask(1, t, t, causal=True)
        assert mask.plain
        where = plan(mask, jnp.ones((1, t)), q, c)
        for key_major, (first, end) in ((False, (where.k_first, where.k_end)), (True, (where.q_first, where.q_end))):
            schedule = _causal(t, q, c, key_major)
            for xp in (np, jnp):  # the static spans and the traced ones
                lo, n = schedule.span(xp.arange(schedule.outer), xp)
                np.testing.assert_array_equal(lo + 0 * n, first[0], err_msg=f"T={t}, Q={q}, C={c}, key-major {key_major}")
                np.testing.assert_array_equal(lo + n, end[0])


@pytest.mark.parametrize("t, block", [(8192, 512), (256, 64), (128, 32)])
def test_a_plain_causal_mask_has_no_empty_grid_step(t, block):
    """An even number of equal blocks: the folded rows hold exactly the causal pairs (8K in 512s: 136 steps a head, not
    256; an odd number leaves the middle block alone in its row)."""
    blocks = t // block
    for key_major in (False, True):
        for passes, minor in ((1, 1), (2, 1), (1, 4)):
            plan = _causal(t, block, block, key_major, passes, minor)
            assert plan.rows * plan.steps == passes * minor * blocks * (blocks + 1) // 2
    full = tpu_schedule.every_block(blocks, blocks)
    assert full.rows * full.steps == blocks**2


def _kernel_grids(**mask_options):
    """The grids of the TPU kernels' pallas_calls (forward, dq, dkv) in LSSAR's forward and backward, T = 64 in blocks
    of 8, 2 heads."""
    q = jnp.zeros((1, 64, 2, 16))
    options = dict(variant="lssar", implementation="pallas", interpret="tpu", block_q=8, block_k=8, **mask_options)
    jaxpr = jax.make_jaxpr(jax.grad(lambda q: attention.attend(q, q, q, **options).sum()))(q).jaxpr
    return [tuple(eqn.params["grid_mapping"].grid) for eqn in walk_eqns(jaxpr) if eqn.primitive.name == "pallas_call"]


def test_the_tpu_kernels_fold_a_plain_causal_mask_and_keep_the_full_grid_otherwise():
    """8 query blocks: 4 folded rows of 9 key blocks (LSSAR's forward twice), against 8 rows of 8 (16) when the
    mask is not plain (segments given, though all one) or not causal."""
    assert _kernel_grids() == [(1, 2, 4, 18), (1, 2, 4, 9), (1, 2, 4, 9)]
    full = [(1, 2, 8, 16), (1, 2, 8, 8), (1, 2, 8, 8)]
    assert _kernel_grids(q_segment_ids=jnp.zeros((1, 64), jnp.int32)) == full
    assert _kernel_grids(causal=False) == full  # plain, but every pair is visible
