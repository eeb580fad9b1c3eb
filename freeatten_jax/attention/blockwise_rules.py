"""The shared row rules (rules.py) in the blockwise layout, for blockwise.py and the ring (ring.py).

Glossary: B batch, K kv heads, G = H // K, Q query-block rows, C key-block columns, D head dim, I query
blocks. Blocks are [B, K, G, Q, C], row statistics [B, K, G, Q, 1], accumulators [B, K, G, Q, D], n is
[B, 1, 1, Q, 1]; under `sweep` every row array gains a leading I. A Rule's `forward(sweep, cfg)` runs
the family's passes through `sweep(init, step, finish, rows_I)`, whose step(carry, s, vis, v, n, rows) and
finish(carry, n) see each query block's N_i and statistics; `grad_block(s, vis, n, rows, dp, cfg)` and
`power_grad_block` (LSSAR's dL/dp share; None for the others) are the family's, given that block's N_i.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from freeatten_jax.attention import rules

_HIGHEST = jax.lax.Precision.HIGHEST


class Config(NamedTuple):
    """What a rule needs besides the blocks: the variant's weight, and LSSAR's p."""

    weight: Callable | None  # weight(scores, n), elementwise
    p: Any  # float32 scalar array (LSSAR's power)
    static_power: int | None  # p as an int when known at trace time, for an exact integer power
    p_grad: bool = False  # p is an array that may be differentiated (a Python number is not)

    def ctx(self, n) -> rules.Ctx:
        return rules.Ctx(n=n, p=self.p, static_power=self.static_power, weight=self.weight, pv=pv)


def pv(w_BKGQC, v_BKCD, acc_BKGQD):
    return acc_BKGQD + jnp.einsum("BKGQC,BKCD->BKGQD", w_BKGQC, v_BKCD, precision=_HIGHEST)


class Rule(NamedTuple):
    family: rules.Family

    def forward(self, sweep, cfg: Config):
        """The output [I, ...] and every statistic, one `sweep` per pass (each pass sees the earlier ones')."""
        out, rows_I = None, None
        for one in self.family.passes:
            out, new = sweep(
                lambda row0, acc0, rows, one=one: one.init(row0, acc0),
                lambda carry, s, vis, v, n, rows, one=one: one.step(carry, self.scaled(s), vis, v, cfg.ctx(n), rows),
                lambda carry, n, one=one: one.finish(carry, cfg.ctx(n)),
                rows_I,
            )
            rows_I = {**(rows_I or {}), **new}
        return out, rows_I

    def backward_rows(self, rows, out, dout, cfg: Config):
        return self.family.backward_rows(rows, out, dout, cfg.p)

    def scaled(self, s):
        """The scores as the family reads them (rules.Family.score_scale)."""
        return s if self.family.score_scale == 1.0 else s * self.family.score_scale

    def grad_block(self, s, vis, n, rows, dp, cfg: Config):
        return self.family.grad(self.scaled(s), vis, cfg.ctx(n), rows, dp)

    @property
    def power_grad_block(self):
        power_grad = self.family.power_grad
        if power_grad is None:
            return None
        return lambda s, vis, n, rows, dp, cfg: power_grad(self.scaled(s), vis, cfg.ctx(n), rows, dp)


RULES = {name: Rule(family) for name, family in rules.FAMILIES.items()}
