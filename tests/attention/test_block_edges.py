"""Block skipping and mask-free interior blocks at their exact boundaries, for every implementation that
skips blocks (issues 15, 20).

Glossary: B batch, T queries, S keys, H heads, K kv heads, D head dim. Batch 1 and key blocks of 8,
so the only visible (query, key) pair of a block pair sits on a block's first or last key: a rule
that skips one block too many (`<` for `<=`) changes the output. Add an implementation that skips
blocks to SKIPPING with options that fix its key block at BLOCK_K. (On a GPU, benchmarks/device_check.py,
Triton's key blocks are 16: the decode cases still sit on edges.) Context parallelism on an axis of
CONTEXT devices holds zig-zag chunks of S / 2n keys: with S = 2n·BLOCK_K each of its key blocks is one
natural chunk, so it runs the cases whose lengths are multiples of 2n·BLOCK_K.
"""

import jax
import jax.numpy as jnp
import pytest
from helpers import INTERPRET, compare, inputs, key

from freeatten_jax import attention

BLOCK_K = 8
CONTEXT = 2


def _context_parallel(q, k, v, **options):
    """context_parallel_attend over a mesh axis of CONTEXT host devices, key blocks of BLOCK_K."""
    mesh = jax.make_mesh((CONTEXT,), ("context",), devices=jax.devices()[:CONTEXT], axis_types=(jax.sharding.AxisType.Auto,))
    return attention.context_parallel_attend(q, k, v, mesh=mesh, axis_name="context", block_q=BLOCK_K, block_k=BLOCK_K, **options)


# name: (attend function, its options, the sequence lengths it takes must be multiples of this)
SKIPPING = {
    "blockwise": (attention.attend, dict(implementation="blockwise", block_q=8, block_k=BLOCK_K), 1),
    "pallas": (attention.attend, dict(implementation="pallas", interpret=INTERPRET, block_q=8, block_k=BLOCK_K), 1),
    "pallas_tpu_kernels": (
        attention.attend,
        dict(implementation="pallas", interpret="tpu" if INTERPRET else False, block_q=8, block_k=BLOCK_K),
        1,
    ),
}
if jax.device_count() >= CONTEXT:  # the 8 forced host devices (tests/conftest.py); not one GPU (device_check.py)
    SKIPPING["context_parallel"] = (_context_parallel, {}, 2 * CONTEXT * BLOCK_K)
K = 2  # a key-block index


def _case(name: str):
    """(variant, t, s, causal, mask options): the lengths put a block edge where the name says."""
    segments = jnp.repeat(jnp.arange(4), BLOCK_K)
    return {
        # one decoded token whose position K * BLOCK_K is the first key of the last block (a block of one key)
        "decode_on_block_start": ("softmax", 1, K * BLOCK_K + 1, True, {}),
        # one decoded token at the last key of a full block
        "decode_on_block_end": ("lssa", 1, K * BLOCK_K, True, {}),
        # one decoded token inside a key block that also holds later (unfilled) cache slots
        "decode_inside_block_before_cache_end": ("lssa", 1, 3 * BLOCK_K, True, dict(q_offset=K * BLOCK_K + 3)),
        # a query block whose largest position is the first key of a block
        "prefill_max_on_block_start": ("lssa", BLOCK_K, K * BLOCK_K + 1, True, {}),
        # a query block whose largest position is the last key of a block
        "prefill_max_on_block_end": ("softmax", BLOCK_K, K * BLOCK_K, True, {}),
        # window 2: neighbouring blocks see each other only through the pair across the edge, on both sides
        "window_edge_on_block_edge": ("lssar", 4 * BLOCK_K, 4 * BLOCK_K, False, dict(window=2)),
        # each document starts on a block edge: a block sees only its own
        "segments_start_on_block_edge": ("softmax", 4 * BLOCK_K, 4 * BLOCK_K, True, dict(q_segment_ids=segments)),
        # interior (mask-free) blocks below the diagonal; the diagonal blocks hold pairs on both sides
        "causal_interior_beside_diagonal": ("lssar", 4 * BLOCK_K, 4 * BLOCK_K, True, {}),
        # window 2C - 1: a neighbouring block's pair farthest apart sits exactly at the window's edge (not interior)
        "window_interior_edge": ("lssa", 4 * BLOCK_K, 4 * BLOCK_K, False, dict(window=2 * BLOCK_K - 1)),
        # queries one position ahead of their keys: each query block's largest position is the first key of the
        # next key block (a length the ring takes, unlike the decode and prefill cases above)
        "shifted_queries_max_on_block_start": (
            "lssa",
            4 * BLOCK_K,
            4 * BLOCK_K,
            True,
            dict(q_positions=jnp.arange(1, 4 * BLOCK_K + 1)),
        ),
        # one padding key inside an otherwise wholly visible block (not interior)
        "padding_key_inside_interior": (
            "softmax",
            4 * BLOCK_K,
            4 * BLOCK_K,
            False,
            dict(kv_mask=jnp.arange(4 * BLOCK_K) != BLOCK_K + 4),
        ),
    }[name]


CASES = [
    "decode_on_block_start",
    "decode_on_block_end",
    "decode_inside_block_before_cache_end",
    "prefill_max_on_block_start",
    "prefill_max_on_block_end",
    "shifted_queries_max_on_block_start",
    "window_edge_on_block_edge",
    "segments_start_on_block_edge",
    "causal_interior_beside_diagonal",
    "window_interior_edge",
    "padding_key_inside_interior",
]


PAIRS = [
    (case, name)
    for case in CASES
    for name, (_, _, multiple) in SKIPPING.items()
    if not any(n % multiple for n in _case(case)[1:3])
]


@pytest.mark.parametrize("case, implementation", PAIRS)
def test_block_edges_match_reference(case, implementation):
    variant, t, s, causal, mask_options = _case(case)
    q, k, v, g = inputs(key("edges", case), 1, t, s, 2, 1, 16)
    attend, options, _ = SKIPPING[implementation]
    compare(q, k, v, g, {}, options, 1e-4, attend=attend, variant=variant, causal=causal, **mask_options)
