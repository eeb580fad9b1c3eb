"""The TPU kernels' sweep order: which (outer block, inner block) pair each step of a grid's last axis visits.

Glossary: O / N number of outer / inner blocks (query-major kernels, forward and dq: query / key blocks;
the key-major dkv kernel: key / query blocks), R grid rows, L steps a row. A grid row visits up to two
outer blocks one after the other, each over its span of inner blocks known when tracing, `passes` times
(LSSAR's forward sweeps twice), `minor` steps an inner block (dkv: the G heads of a group). Without a plain
mask every span is every inner block, and the visiting spans that pallas_plan computes at run time decide
which steps compute (the others neither compute nor fetch, but each still costs a grid step). A plain
causal mask (`Mask.plain`, T == S with default positions: known when tracing) has the causal spans, and
outer block o shares a row with O - 1 - o: the triangle folded into a rectangle (no empty step for an even
number of equal blocks).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

FIELDS = 8  # a grid row's table entries: its steps before the second block and in all (both static), then
# (outer block, span start, span length) of its first and of its second block


class Schedule(NamedTuple):
    rows: int  # R
    steps: int  # L
    table: np.ndarray  # [R · FIELDS] int32, flat: a scalar-prefetch operand with no second axis to shard
    passes: int
    minor: int
    every: int | None = None  # N when every outer block sweeps every inner block (row r is outer block r; no table read)


def _rows(pairs, lo, n, each: int) -> np.ndarray:
    """The table for grid rows visiting outer blocks (a, b) (b None: a alone), `each` steps an inner block."""
    cols = []
    for a, b in pairs:
        second = (a, lo[a], 0) if b is None else (b, lo[b], n[b])
        cols.append((each * n[a], each * (n[a] + second[2]), a, lo[a], n[a], *second))
    return np.asarray(cols, np.int32).reshape(-1)


def schedule(lo, n, passes: int = 1, minor: int = 1) -> Schedule:
    """The rows for spans [lo_o, lo_o + n_o) (every n_o ≥ 1): outer blocks folded in pairs (o, O - 1 - o) when that
    takes fewer steps in all than one outer block a row."""
    lo, n = np.asarray(lo), np.asarray(n)
    assert n.min() >= 1, "every outer block visits an inner block"
    o, each = len(n), passes * minor
    single = _rows([(a, None) for a in range(o)], lo, n, each), each * int(n.max())
    pairs = [(a, o - 1 - a) for a in range(o // 2)] + ([(o // 2, None)] if o % 2 else [])
    folded = _rows(pairs, lo, n, each), each * max(int(n[a]) + (0 if b is None else int(n[b])) for a, b in pairs)
    table, steps = min(single, folded, key=lambda s: len(s[0]) * s[1])
    return Schedule(len(table) // FIELDS, steps, table, passes, minor)


def full(outer: int, inner: int, passes: int = 1, minor: int = 1) -> Schedule:
    """Every inner block for every outer block (the visiting spans decided at run time), by arithmetic alone."""
    return Schedule(outer, passes * minor * inner, np.zeros(FIELDS, np.int32), passes, minor, inner)


def causal_spans(length: int, outer_block: int, inner_block: int, outer: int, inner: int, key_major: bool):
    """(lo, n) of a plain causal mask over `length` tokens: query block i sees key block j iff j·C ≤ its last
    position (padded rows repeat position length - 1; keys past `length` are padding, in no block's span)."""
    sides = (inner_block, outer_block, inner, outer) if key_major else (outer_block, inner_block, outer, inner)
    q_block, k_block, q_count, k_count = sides
    last_q = np.minimum((np.arange(q_count) + 1) * q_block, length) - 1
    sees_IJ = (np.arange(k_count) * k_block)[None, :] <= last_q[:, None]
    sees = sees_IJ.T if key_major else sees_IJ
    lo = np.argmax(sees, axis=1)
    return lo, sees.sum(axis=1)


class Step(NamedTuple):
    """Grid step (r, t) of a schedule, as scalars: `valid` False on a row's idle tail (which holds its last step)."""

    outer: jax.Array
    sweep: jax.Array  # the pass
    inner: jax.Array
    minor: jax.Array
    first: jax.Array  # the pass's first step on this outer block (never on the idle tail)
    last: jax.Array  # its last (likewise)
    valid: jax.Array


def locate(plan: Schedule, table_ref, r, t) -> Step:
    """Where step t of grid row r goes: scalar arithmetic that every index map repeats on every grid step (Mosaic
    does not share it between them), so the static parts come from the table, the table's fields load
    independently (no chain of load latencies), and `full` schedules read none."""
    minor = plan.minor
    if plan.every is not None:
        outer, lo, n, rest, valid = r, 0, plan.every, t, jnp.bool_(True)
    else:
        split, total, *blocks = (table_ref[FIELDS * r + x] for x in range(FIELDS))
        valid = t < total
        t = jnp.minimum(t, total - 1)
        second = t >= split
        outer, lo, n = (jnp.where(second, b, a) for a, b in zip(blocks[:3], blocks[3:]))
        rest = t - jnp.where(second, split, 0)
    per_pass = n * minor
    sweep = jnp.zeros((), jnp.int32)
    if plan.passes > 1 and plan.every is not None:
        sweep, rest = jax.lax.div(rest, per_pass), jax.lax.rem(rest, per_pass)  # a constant divisor
    elif plan.passes > 1:
        for k in range(1, plan.passes):
            sweep += (rest >= k * per_pass).astype(jnp.int32)
        rest = rest - sweep * per_pass
    inner, within = lo + rest, jnp.zeros((), jnp.int32)
    if minor > 1:
        inner, within = lo + jax.lax.div(rest, minor), jax.lax.rem(rest, minor)
    first, last = (rest == 0) & valid, (rest == per_pass - 1) & valid
    return Step(outer, sweep, inner, within, first, last, valid)
