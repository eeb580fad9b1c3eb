"""Document masking: per-token segment ids and positions that restart at each EOS-delimited document.

Glossary: B batch, T positions. An EOS token opens a document (llm.c writes one before every document,
text sources insert one before every file when masking is on): it is position 0 of the document it opens,
so the EOS -> first-token target is predicted from the EOS alone and no target ever sees another
document. Tokens before a window's first EOS continue a document begun outside the window: segment 0,
positions 0.. from the window start, so N_i = position + 1 = the keys the window really holds for them.
Computed from the tokens (on device, inside the step): nothing extra to load, ship or checkpoint.
"""

import jax
import jax.numpy as jnp


def segments(tokens_BT, eos_id: int) -> tuple[jax.Array, jax.Array]:
    """(segment_ids_BT, positions_BT) int32: a new segment starts at every EOS; positions restart with it."""
    opens_BT = jnp.asarray(tokens_BT) == eos_id
    segment_ids_BT = jnp.cumsum(opens_BT, axis=1, dtype=jnp.int32)
    t_T = jnp.arange(opens_BT.shape[1], dtype=jnp.int32)
    start_BT = jax.lax.cummax(jnp.where(opens_BT, t_T, 0), axis=1)  # the last document start at or before t
    return segment_ids_BT, t_T - start_BT


def model_inputs(inputs_BT, eos_id: int | None) -> dict:
    """The model's keyword arguments for these input tokens: none without document masking (eos_id None)."""
    if eos_id is None:
        return {}
    segment_ids_BT, positions_BT = segments(inputs_BT, eos_id)
    return {"segment_ids_BT": segment_ids_BT, "positions_BT": positions_BT}
