"""Gradients handed out together, so that XLA cannot postpone one and keep a layer's activations alive for it.

XLA's latency-hiding scheduler moves work that nothing needs until the optimizer (a weight's gradient `x^T g`, a bias's
or a norm scale's sum over tokens) later, to overlap later layers' collectives (the context-parallel ring's rotations
above all), and the activations it reads stay alive until then. On 8 x H100 at 512K tokens a layer cost 1.44 GiB where
it must keep 0.20 (benchmarks/history/long_context.md, issue 54 third round). Two optimization barriers stop that: `dense` ties a
projection's weight gradient to its input's, `block` a whole block's parameter gradients to the block's input gradient.
Values are unchanged, bit for bit.
"""

import functools

import jax
import jax.numpy as jnp
from flax import nnx


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def dense(spec: str, x, w):
    """jnp.einsum(spec, x, w) for a two-operand projection spec such as "BTE,EF->BTF"."""
    return jnp.einsum(spec, x, w)


def _dense_forward(spec, x, w):
    return jnp.einsum(spec, x, w), (x, w)


def _dense_backward(spec, residuals, g):
    _, vjp = jax.vjp(functools.partial(jnp.einsum, spec), *residuals)
    return jax.lax.optimization_barrier(vjp(g))


dense.defvjp(_dense_forward, _dense_backward)


def block(module: nnx.Module, x):
    """x unchanged; in the backward, `module`'s parameter gradients and x's come out together (call it on the input
    that then goes through `module`)."""
    params, x = _together(nnx.state(module, nnx.Param), x)
    nnx.update(module, params)
    return x


@jax.custom_vjp
def _together(params, x):
    return params, x


_together.defvjp(lambda params, x: ((params, x), None), lambda _, g: jax.lax.optimization_barrier(g))
