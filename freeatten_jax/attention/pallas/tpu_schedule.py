"""The TPU kernels' sweep order: which (outer block, inner block) pair each step of a grid's last axis visits.

Glossary: O / N number of outer / inner blocks (query-major kernels, forward and dq: query / key blocks;
the key-major dkv kernel: key / query blocks), R grid rows, L steps a row, T tokens. An outer block sweeps
its span of inner blocks `passes` times (LSSAR's forward sweeps twice), `minor` steps an inner block (dkv:
the G heads of a group). Without a plain mask every span is every inner block and row r is outer block r:
the visiting spans that plan.py computes at run time decide which steps compute (the others neither
compute nor fetch, but each still costs a grid step). A plain causal mask (`Mask.plain`: T == S, default
positions, known when tracing) has the causal spans, and outer block o shares a grid row with O - 1 - o: the
triangle folded into a rectangle, no empty step for an even number of equal blocks. Every index map
recomputes its step's blocks on every grid step (Mosaic shares nothing between index maps), so both
schedules are scalar arithmetic on the grid indices and static constants: no table, no memory load.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Causal(NamedTuple):
    """A plain causal mask's geometry: T, and the outer and inner block lengths."""

    length: int
    outer_block: int
    inner_block: int
    key_major: bool


class Schedule(NamedTuple):
    outer: int  # O
    inner: int  # N
    passes: int = 1
    minor: int = 1
    causal: Causal | None = None  # None: every inner block for every outer block

    def span(self, o, xp=jnp):
        """(first inner block, count) of outer block(s) o; xp=np for static values. Query block i sees key block j
        iff j·C ≤ its last position (padded rows repeat position T - 1; keys past T are padding, in no span), so
        key block j is seen from query block ⌊j·C / Q⌋ to the last."""
        if self.causal is None:
            return 0 * o, self.inner + 0 * o
        length, outer_block, inner_block, key_major = self.causal
        div = (lambda a, b: a // b) if xp is np else jax.lax.div  # non-negative: floor is C division
        if key_major:
            lo = div(o * outer_block, inner_block)
            return lo, self.inner - lo
        return 0 * o, xp.minimum(self.inner, div(xp.minimum((o + 1) * outer_block, length) - 1, inner_block) + 1)

    def _pairs(self, r, xp=jnp):
        """The outer blocks (a, b) of grid row r and their spans; b's count is 0 where it is a (the middle row)."""
        if self.causal is None:
            return (r, *self.span(r, xp)), (r, r, 0 * r)
        a, b = r, self.outer - 1 - r
        (lo_a, n_a), (lo_b, n_b) = self.span(a, xp), self.span(b, xp)
        return (a, lo_a, n_a), (b, lo_b, xp.where(b == a, 0, n_b))

    @property
    def rows(self) -> int:  # R
        return self.outer if self.causal is None else (self.outer + 1) // 2

    @property
    def steps(self) -> int:  # L
        (_, _, n_a), (_, _, n_b) = self._pairs(np.arange(self.rows), np)
        return self.passes * self.minor * int(np.max(n_a + n_b))


def every_block(outer: int, inner: int, passes: int = 1, minor: int = 1) -> Schedule:
    """Every inner block for every outer block (the visiting spans decided at run time)."""
    return Schedule(outer, inner, passes, minor)


class Step(NamedTuple):
    """Grid step (r, t) of a schedule, as scalars: `valid` False on a row's idle tail (which holds its last step)."""

    outer: jax.Array
    which: jax.Array  # the pass
    inner: jax.Array
    minor: jax.Array
    first: jax.Array  # the pass's first step on this outer block (never on the idle tail)
    last: jax.Array  # its last (likewise)
    valid: jax.Array


def locate(schedule: Schedule, r, t) -> Step:
    """Where step t of grid row r goes: the row's first outer block for its first steps, then its second, each
    sweeping its span `passes` times; an idle step repeats the row's last step (nothing new fetched)."""
    each = schedule.passes * schedule.minor
    if schedule.causal is None:  # row r is outer block r, over every inner block
        outer, lo, n, rest, valid = r, jnp.int32(0), jnp.int32(schedule.inner), t, jnp.bool_(True)
    else:
        (a, lo_a, n_a), (b, lo_b, n_b) = schedule._pairs(r)
        split = each * n_a
        total = split + each * n_b
        valid = t < total
        t = jnp.minimum(t, total - 1)
        second = t >= split
        outer, lo, n = (jnp.where(second, y, x) for x, y in ((a, b), (lo_a, lo_b), (n_a, n_b)))
        rest = t - jnp.where(second, split, 0)
    per_pass = n * schedule.minor
    which = jnp.zeros_like(rest)
    if schedule.passes > 1 and schedule.causal is None:
        which, rest = jax.lax.div(rest, per_pass), jax.lax.rem(rest, per_pass)  # a constant divisor
    elif schedule.passes > 1:
        for k in range(1, schedule.passes):
            which += (rest >= k * per_pass).astype(rest.dtype)
        rest = rest - which * per_pass
    inner, within = lo + rest, jnp.zeros_like(rest)
    if schedule.minor > 1:
        inner, within = lo + jax.lax.div(rest, schedule.minor), jax.lax.rem(rest, schedule.minor)
    first, last = (rest == 0) & valid, (rest == per_pass - 1) & valid
    return Step(outer, which, inner, within, first, last, valid)
