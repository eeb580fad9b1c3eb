"""The model's projections: an einsum whose backward hands out the input's and the weight's gradients together.

XLA's latency-hiding scheduler otherwise postpones a weight gradient (`x^T g`, needed by nothing until the optimizer)
to overlap a later layer's collectives, the context-parallel ring's rotations above all, and the layer's activations
`x` stay alive until then: on 8 x H100 at 512K tokens, two layers' MLP activations at once (1.44 GiB a layer instead of
0.20; benchmarks/RESULTS.md, issue 54 third round). An optimization barrier over both gradients computes the weight's
as soon as the input's. Same values as jnp.einsum, bit for bit.
"""

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def dense(spec: str, x, w):
    """jnp.einsum(spec, x, w) for a two-operand projection spec such as "BTE,EF->BTF"."""
    return jnp.einsum(spec, x, w)


def _forward(spec, x, w):
    return jnp.einsum(spec, x, w), (x, w)


def _backward(spec, residuals, g):
    _, vjp = jax.vjp(functools.partial(jnp.einsum, spec), *residuals)
    return jax.lax.optimization_barrier(vjp(g))


dense.defvjp(_forward, _backward)
