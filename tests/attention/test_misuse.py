"""Misuse of the library (issue 53 item 3): every wrong argument to `attend`, `context_parallel_attend`, the Flax
adapter, the KV cache, `sharded_decode_attend` and the lm-evaluation-harness model raises one ValueError / TypeError
naming the argument and what it allows, while the arguments are parsed (before anything is traced or compiled); none
returns NaN or broadcasts silently.

Glossary: B batch, T queries, S keys, H heads, K kv heads, D head dim.
"""

import functools
import math

import jax
import jax.numpy as jnp
import pytest

from freeatten_jax import attention
from freeatten_jax.attention import context_parallel, sharded_decode
from freeatten_jax.attention.flax_adapter import flax_attention_fn
from freeatten_jax.nn.attention_layer import KVCache

Auto = jax.sharding.AxisType.Auto
q_BTHD = jnp.zeros((1, 8, 4, 16), jnp.float32)
k_BSKD = jnp.zeros((1, 8, 2, 16), jnp.float32)
attend = functools.partial(attention.attend, variant="softmax")


def _ring(length: int = 20, axis_name: str = "context", **options):
    mesh = jax.make_mesh((4,), ("context",), devices=jax.devices()[:4], axis_types=(Auto,))
    q = jnp.zeros((1, length, 2, 8))
    return context_parallel.context_parallel_attend(q, q, q, mesh=mesh, axis_name=axis_name, **options)


def _decode(mesh_shape=(4,), k_len: int = 16, heads: int = 2, **options):
    """One decoding query against a cache of `k_len` slots split over the mesh's first axis, 'context'."""
    names = ("context", "tensor")[: len(mesh_shape)]
    mesh = jax.make_mesh(mesh_shape, names, devices=jax.devices()[: math.prod(mesh_shape)], axis_types=(Auto,) * len(names))
    k = jnp.zeros((1, k_len, 2, 8))
    arguments = {"mesh": mesh, "axis_name": "context", "variant": "lssar", **options}
    return sharded_decode.sharded_decode_attend(jnp.zeros((1, 1, heads, 8)), k, k, **arguments)


def _harness_model(workdir=__file__, **arguments):
    """The lm-evaluation-harness model `freeatten` (this file is no run: a call that gets past its checks says so)."""
    from freeatten_jax.evaluation.harness import FreeattenLM

    return FreeattenLM(workdir, **arguments)


def _cache_append(t: int, filled: int):
    cache = KVCache.empty(1, 8, 2, 16, jnp.float32)
    cache = cache.append(
        *(jnp.zeros((1, filled, 2, 16)),) * 2, jnp.zeros((1, filled), jnp.int32), jnp.zeros((1, filled), jnp.int32)
    )
    return cache.append(*(jnp.zeros((1, t, 2, 16)),) * 2, jnp.zeros((1, t), jnp.int32), jnp.zeros((1, t), jnp.int32))


MISUSES = {  # name: (call, error, a regular expression the one-line message must match)
    "q of rank 3": (lambda: attend(q_BTHD[0], k_BSKD, k_BSKD), ValueError, r"q, k, v must be \[batch, len, heads, head_dim\]"),
    "integer q": (lambda: attend(q_BTHD.astype(jnp.int32), k_BSKD, k_BSKD), ValueError, "must be floating point"),
    "k in another dtype": (
        lambda: attend(q_BTHD, k_BSKD.astype(jnp.bfloat16), k_BSKD),
        ValueError,
        "q, k, v must share one dtype, got float32, bfloat16, float32",
    ),
    "heads not a multiple of kv heads": (
        lambda: attend(jnp.zeros((1, 8, 3, 16)), k_BSKD, k_BSKD),
        ValueError,
        "num_heads 3 must be a multiple of num_kv_heads 2",
    ),
    "head dims differ": (
        lambda: attend(q_BTHD, jnp.zeros((1, 8, 2, 8)), jnp.zeros((1, 8, 2, 8))),
        ValueError,
        "must agree on batch and head_dim",
    ),
    "k and v lengths differ": (lambda: attend(q_BTHD, k_BSKD, k_BSKD[:, :6]), ValueError, "k and v shapes differ"),
    "unknown variant": (lambda: attention.attend(q_BTHD, k_BSKD, k_BSKD, variant="flash"), ValueError, "softmax, ssmax, lssa"),
    "p = 0": (lambda: attend(q_BTHD, k_BSKD, k_BSKD, variant="lssar", p=0.0), ValueError, "p must be > 0 and finite, got 0.0"),
    "p negative": (lambda: attend(q_BTHD, k_BSKD, k_BSKD, variant="lssar", p=-1.0), ValueError, "p must be > 0"),
    "p NaN": (lambda: attend(q_BTHD, k_BSKD, k_BSKD, variant="lssar", p=float("nan")), ValueError, "p must be > 0 and finite"),
    "p not a scalar": (
        lambda: attend(q_BTHD, k_BSKD, k_BSKD, variant="lssar", p=jnp.ones(3)),
        ValueError,
        r"p must be a scalar, got shape \(3,\)",
    ),
    "s of the wrong shape": (
        lambda: attend(q_BTHD, k_BSKD, k_BSKD, variant="ssmax", s=jnp.ones(3)),
        ValueError,
        r"s must be a scalar or have shape \[4\], got shape \(3,\)",
    ),
    "b of the wrong shape": (
        lambda: attend(q_BTHD, k_BSKD, k_BSKD, variant="ssmax", b=jnp.ones(5)),
        ValueError,
        r"b must be a scalar or have shape \[4\]",
    ),
    "temperature_length 0": (
        lambda: attend(q_BTHD, k_BSKD, k_BSKD, variant="lssa", temperature_length=0),
        ValueError,
        "temperature_length must be > 0",
    ),
    "a scale for lssa": (lambda: attend(q_BTHD, k_BSKD, k_BSKD, variant="lssa", scale=2.0), ValueError, "takes no scale"),
    "q_offset beyond the cache": (
        lambda: attend(q_BTHD[:, :4], k_BSKD, k_BSKD, q_offset=5),
        ValueError,
        r"q_offset must be in \[0, kv_len - q_len\] = \[0, 4\] .*got 5",
    ),
    "q_offset negative": (lambda: attend(q_BTHD[:, :4], k_BSKD, k_BSKD, q_offset=-1), ValueError, r"= \[0, 4\] .*got -1"),
    "q_offset per row, one beyond": (
        lambda: attend(jnp.zeros((2, 4, 4, 16)), jnp.zeros((2, 8, 2, 16)), jnp.zeros((2, 8, 2, 16)), q_offset=jnp.array([2, 6])),
        ValueError,
        r"got \[2, 6\]",
    ),
    "q_offset and q_positions": (
        lambda: attend(q_BTHD, k_BSKD, k_BSKD, q_offset=0, q_positions=jnp.arange(8)),
        ValueError,
        "not both",
    ),
    "window 0": (lambda: attend(q_BTHD, k_BSKD, k_BSKD, window=0), ValueError, "window must be a positive int"),
    "causal not a bool": (
        lambda: attend(q_BTHD, k_BSKD, k_BSKD, causal="yes"),
        TypeError,
        "causal must be True or False, got 'yes'",
    ),
    "segment ids of the wrong length": (
        lambda: attend(q_BTHD, k_BSKD, k_BSKD, q_segment_ids=jnp.zeros((1, 5), jnp.int32)),
        ValueError,
        r"q_segment_ids must have shape \[8\] or \[batch, 8\]",
    ),
    "float segment ids": (
        lambda: attend(q_BTHD, k_BSKD, k_BSKD, q_segment_ids=jnp.full((1, 8), 0.5)),
        ValueError,
        "q_segment_ids must be integers, got float32",
    ),
    "float positions": (
        lambda: attend(q_BTHD, k_BSKD, k_BSKD, kv_positions=jnp.arange(8) * 0.5),
        ValueError,
        "kv_positions must be integers",
    ),
    "float kv_mask": (lambda: attend(q_BTHD, k_BSKD, k_BSKD, kv_mask=jnp.full(8, 0.5)), ValueError, "kv_mask must be boolean"),
    "a dense mask not boolean": (
        lambda: attend(q_BTHD, k_BSKD, k_BSKD, mask=jnp.ones((1, 1, 8, 8))),
        ValueError,
        "mask must be boolean",
    ),
    "block_q 0": (
        lambda: attend(q_BTHD, k_BSKD, k_BSKD, implementation="blockwise", block_q=0),
        ValueError,
        "block_q must be a positive int",
    ),
    "unknown implementation": (lambda: attend(q_BTHD, k_BSKD, k_BSKD, implementation="magic"), ValueError, "implementation"),
    "unknown option": (
        lambda: attend(q_BTHD, k_BSKD, k_BSKD, variant="lssar", pp=3),
        ValueError,
        r"unknown option\(s\) \['pp'\]",
    ),
    "check_finite: bfloat16 q and k of 1e30 (q·k overflows float32)": (
        lambda: attend(*(jnp.full((1, 8, 2, 16), 1e30, jnp.bfloat16),) * 3, check_finite=True),
        ValueError,
        r"check_finite: q and k overflow together: \|q_i\| up to 4e\+30 .* not below 1e\+29",
    ),
    "check_finite: q whose squared norm overflows (lssa normalises it)": (
        lambda: attend(q_BTHD.at[0, 2, 1].set(1e20), k_BSKD + 1, k_BSKD, variant="lssa", check_finite=True),
        ValueError,
        r"check_finite: q's squared norm overflows float32: \|q\| = 4e\+20 at \[0, 2, 1\]",
    ),
    "check_finite: v that makes relu's output overflow": (
        lambda: attend(q_BTHD + 1e3, k_BSKD + 1e3, k_BSKD + 1e36, variant="relu", check_finite=True),
        ValueError,
        r"check_finite: v is too large for variant 'relu'",
    ),
    "check_finite: a NaN key that a query sees": (
        lambda: attend(q_BTHD, k_BSKD.at[0, 3, 1, 2].set(jnp.nan), k_BSKD, check_finite=True),
        ValueError,
        r"check_finite: k holds NaN or Inf at \[0, 3, 1, 2\], in a key that a query sees",
    ),
    "check_finite: traced inputs": (
        lambda: jax.jit(lambda q: attend(q, k_BSKD, k_BSKD, check_finite=True))(q_BTHD),
        ValueError,
        "check_finite=True checks the values of q, k and v, but q is traced",
    ),
    "check_finite not a bool": (
        lambda: attend(q_BTHD, k_BSKD, k_BSKD, check_finite="yes"),
        TypeError,
        "check_finite must be True or False, got 'yes'",
    ),
    "ring: length not a multiple of 2 x context": (
        lambda: _ring(variant="lssa"),
        ValueError,
        "q_len 20 must be a multiple of 2 x the 'context' axis size",
    ),
    "ring: an axis the mesh lacks": (lambda: _ring(16, "sequence", variant="lssa"), ValueError, "not an axis of the mesh"),
    "ring: p = 0": (lambda: _ring(16, variant="lssar", p=0.0), ValueError, "p must be > 0"),
    "ring: k in another dtype": (
        lambda: context_parallel.context_parallel_attend(
            jnp.zeros((1, 16, 2, 8)),
            *(jnp.zeros((1, 16, 2, 8), jnp.bfloat16),) * 2,
            mesh=jax.make_mesh((4,), ("context",)),
            axis_name="context",
            variant="lssa",
        ),
        ValueError,
        "q, k, v must share one dtype",
    ),
    "ring: a mesh that is not a Mesh": (
        lambda: context_parallel.context_parallel_attend(q_BTHD, k_BSKD, k_BSKD, mesh=(4,), axis_name="context", variant="lssa"),
        TypeError,
        "mesh must be a jax.sharding.Mesh or AbstractMesh, got tuple",
    ),
    "ring: a batch axis the mesh lacks": (
        lambda: _ring(16, variant="lssa", batch_axis="data"),
        ValueError,
        r"batch_axis 'data' is invalid; allowed: None, or axes of the mesh other than 'context': \[\]",
    ),
    "flax adapter: a mask option": (lambda: flax_attention_fn("lssa", causal=True), ValueError, "takes no mask option"),
    "flax adapter: dropout": (
        lambda: flax_attention_fn("lssa")(q_BTHD, q_BTHD, q_BTHD, dropout_rate=0.1),
        ValueError,
        "attention dropout is not supported",
    ),
    "flax adapter: unknown variant": (lambda: flax_attention_fn("cosine"), ValueError, "softmax, ssmax, lssa"),
    "KV cache: more new tokens than slots": (
        lambda: _cache_append(9, 0),
        ValueError,
        "9 new tokens do not fit the KV cache: 8 of its 8",
    ),
    "KV cache: more new tokens than free slots": (
        lambda: _cache_append(3, 6),
        ValueError,
        "3 new tokens do not fit the KV cache: 2 of its 8 slots are free",
    ),
    "sharded decode: a mesh that is not a Mesh": (lambda: _decode(mesh=None), TypeError, "mesh must be a jax.sharding.Mesh"),
    "sharded decode: an axis the mesh lacks": (
        lambda: _decode(axis_name="sequence"),
        ValueError,
        r"axis_name 'sequence' is not an axis of the mesh \{'context': 4\}",
    ),
    "sharded decode: the cache not a multiple of the axis": (
        lambda: _decode(k_len=18),
        ValueError,
        r"kv_len 18 must be a multiple of the 'context' axis size \(4\)",
    ),
    "sharded decode: the batch axis is the cache's": (
        lambda: _decode(batch_axis="context"),
        ValueError,
        r"batch_axis 'context' is invalid; allowed: None, or axes of the mesh other than 'context': \[\]",
    ),
    "sharded decode: a head axis that does not divide the kv heads": (
        lambda: _decode((2, 4), heads=4, head_axis="tensor"),
        ValueError,
        r"head_axis 'tensor' cannot split num_kv_heads 2 over 4 devices; allowed: axes whose size divides it, or None",
    ),
    "sharded decode: a dense mask": (
        lambda: _decode(mask=jnp.ones((1, 1, 1, 16), bool)),
        ValueError,
        "does not support a dense mask",
    ),
    "sharded decode: an option it lacks": (
        lambda: _decode(implementation="pallas"),
        ValueError,
        r"unknown option\(s\) \['implementation'\] for sharded_decode_attend; it takes block_k",
    ),
    "sharded decode: block_k 0": (lambda: _decode(block_k=0), ValueError, r"block_k must be a positive int \(or None\), got 0"),
    "sharded decode: p = 0": (lambda: _decode(p=0.0), ValueError, "p must be > 0 and finite, got 0.0"),
    "sharded decode: q_offset beyond the cache": (
        lambda: _decode(q_offset=16),
        ValueError,
        r"q_offset must be in \[0, kv_len - q_len\] = \[0, 15\]",
    ),
    "harness model: multiplier 0": (
        lambda: _harness_model(multiplier=0),
        ValueError,
        "multiplier must be an integer >= 1, got 0",
    ),
    "harness model: multiplier a string": (
        lambda: _harness_model(multiplier="4"),
        ValueError,
        "multiplier must be an integer >= 1, got '4'",
    ),
    "harness model: batch_tokens 0": (
        lambda: _harness_model(batch_tokens=0),
        ValueError,
        "batch_tokens must be an integer >= 1, got 0",
    ),
    "harness model: unknown implementation": (
        lambda: _harness_model(implementation="magic"),
        ValueError,
        "implementation 'magic' is unknown; allowed: reference, blockwise, pallas, auto",
    ),
    "harness model: unknown switch": (
        lambda: _harness_model(switch="q=3"),
        ValueError,
        "unknown switch 'q' in 'q=3'; valid switches: p, rope_theta",
    ),
    "harness model: a switch value that is not a number": (
        lambda: _harness_model(switch="p=abc"),
        ValueError,
        r"switch p='abc' is not a number",
    ),
    "harness model: a workdir that is not a run": (
        lambda: _harness_model(),
        ValueError,
        r"workdir '.*test_misuse.py' is not a trained run \(no checkpoint in .*\); allowed: a run's WORKDIR or WORKDIR@STEP",
    ),
    "harness model: a workdir that is no path": (
        lambda: _harness_model(None),
        TypeError,
        "workdir must be a path .* or a loaded Run, got NoneType",
    ),
}


@pytest.mark.parametrize("name", MISUSES)
def test_each_misuse_is_one_error_line_naming_the_argument(name):
    call, error, message = MISUSES[name]
    with pytest.raises(error, match=message) as caught:
        call()
    assert "\n" not in str(caught.value), str(caught.value)
