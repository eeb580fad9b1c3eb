"""Block skipping at its exact boundaries, for every implementation that skips blocks (issue 15).

Glossary: B batch, T queries, S keys, H heads, K kv heads, D head dim. Batch 1 and key blocks of 8,
so the only visible (query, key) pair of a block pair sits on a block's first or last key: a rule
that skips one block too many (`<` for `<=`) changes the output. Add an implementation that skips
blocks (context parallel, ...) to SKIPPING with options that fix its key block at BLOCK_K. (On a
GPU, benchmarks/device_check.py, Triton's key blocks are 16: the decode cases still sit on edges.)
"""
import jax.numpy as jnp
import pytest

from test_pallas import INTERPRET, compare, inputs, key

BLOCK_K = 8
SKIPPING = {
    "blockwise": dict(implementation="blockwise", block_q=8, block_k=BLOCK_K),
    "pallas": dict(implementation="pallas", interpret=INTERPRET, block_q=8, block_k=BLOCK_K),
}
K = 2  # a key-block index


def _case(name: str):
    """(variant, t, s, causal, mask options): the lengths put a block edge where the name says."""
    segments = jnp.array([0] * BLOCK_K + [1] * BLOCK_K + [2] * BLOCK_K)
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
        "window_edge_on_block_edge": ("lssar", 3 * BLOCK_K, 3 * BLOCK_K, False, dict(window=2)),
        # each document starts on a block edge: a block sees only its own
        "segments_start_on_block_edge": ("softmax", 3 * BLOCK_K, 3 * BLOCK_K, True, dict(q_segment_ids=segments)),
    }[name]


CASES = [
    "decode_on_block_start",
    "decode_on_block_end",
    "decode_inside_block_before_cache_end",
    "prefill_max_on_block_start",
    "prefill_max_on_block_end",
    "window_edge_on_block_edge",
    "segments_start_on_block_edge",
]


@pytest.mark.parametrize("implementation", list(SKIPPING))
@pytest.mark.parametrize("case", CASES)
def test_block_edges_match_reference(case, implementation):
    variant, t, s, causal, mask_options = _case(case)
    q, k, v, g = inputs(key("edges", case), 1, t, s, 2, 1, 16)
    compare(q, k, v, g, {}, SKIPPING[implementation], 1e-4, variant=variant, causal=causal, **mask_options)
