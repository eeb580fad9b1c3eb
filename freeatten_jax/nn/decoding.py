"""Sampling with a KV cache: prefill the prompt (optionally in chunks), then one jitted step per token.

Glossary: B batch, T prompt length, C chunk length, V vocabulary.
Cache slots hold absolute positions, so N_i in ssmax/lssa/lssar is the query's position + 1,
exactly as in a full forward pass over the same tokens. Under a mesh whose rule 'cache_length' splits the cache's
slots over a 'context' axis (nn.sharding), the prompt goes round the ring and each step attends to every device's own
slots.
"""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from freeatten_jax.nn import sharding


def prefill(model, tokens_BT, cache, *, chunk: int | None = None, positions_BT=None, segment_ids_BT=None, last: bool = False):
    """(logits_BTV, cache) after appending the prompt, `chunk` tokens at a time (None: all at once); with `last`, the
    logits of the last position alone ([B, 1, V]: a long prompt's whole logits are T x V floats).

    Chunking bounds attention memory to C x cache slots for prompts far longer than one block. Where the cache's
    slots are split over n devices, the last piece is cut at a multiple of 2n: the prompt up to it goes round the
    ring, the few tokens after it through the decoding step.
    """
    t, ring = tokens_BT.shape[1], sharding.cache_chunks()
    starts = sorted({*range(0, t, chunk or t), t - t % ring} - {t})
    pieces: list[jax.Array] = []
    for start, stop in zip(starts, [*starts[1:], t]):
        part = slice(start, stop)
        positions = None if positions_BT is None else positions_BT[:, part]
        segments = None if segment_ids_BT is None else segment_ids_BT[:, part]
        x_BCE, cache = model.features(tokens_BT[:, part], positions_BT=positions, segment_ids_BT=segments, cache=cache)
        pieces = [x_BCE[:, -1:]] if last else [*pieces, x_BCE]
    return model.logits(jnp.concatenate(pieces, axis=1)), cache


def sample(logits_BV, key, temperature: float, top_k: int | None = None, top_p: float | None = None) -> jax.Array:
    """Next tokens [B]: greedy when temperature == 0, else from softmax(logits / temperature) restricted to
    the top k tokens and to the smallest set whose probability reaches top_p (nucleus sampling)."""
    if temperature == 0:
        return jnp.argmax(logits_BV, axis=-1)
    logits_BV = logits_BV / temperature
    if top_k is not None:
        kth_B1 = jax.lax.top_k(logits_BV, top_k)[0][:, -1:]
        logits_BV = jnp.where(logits_BV < kth_B1, -jnp.inf, logits_BV)
    if top_p is not None:
        sorted_BV = jnp.sort(logits_BV, axis=-1)[:, ::-1]
        before_BV = jnp.cumsum(jax.nn.softmax(sorted_BV, axis=-1), axis=-1) - jax.nn.softmax(sorted_BV, axis=-1)
        cutoff_B1 = jnp.min(jnp.where(before_BV < top_p, sorted_BV, jnp.inf), axis=-1, keepdims=True)  # the last kept logit
        logits_BV = jnp.where(logits_BV < cutoff_B1, -jnp.inf, logits_BV)
    return jax.random.categorical(key, logits_BV, axis=-1)


_SAMPLING = ("temperature", "top_k", "top_p")


@functools.partial(jax.jit, static_argnames=("graphdef", "slots", "chunk", *_SAMPLING))
def _prefill_and_sample(
    state, tokens_BT, key, positions_BT, segment_ids_BT, *, graphdef, slots, chunk, temperature, top_k, top_p
):
    """The first sampled tokens and the cache of `slots` slots holding the prompt (made here: a sharded cache is never
    whole on one device)."""
    model = nnx.merge(graphdef, state)
    cache = model.init_cache(tokens_BT.shape[0], slots)
    logits_B1V, cache = prefill(
        model, tokens_BT, cache, chunk=chunk, positions_BT=positions_BT, segment_ids_BT=segment_ids_BT, last=True
    )
    return sample(logits_B1V[:, -1], key, temperature, top_k, top_p), cache


@functools.partial(jax.jit, static_argnames=("graphdef", *_SAMPLING), donate_argnames=("cache",))
def _step(state, token_B, cache, key, *, graphdef, temperature, top_k, top_p):
    logits_B1V, cache = nnx.merge(graphdef, state)(token_B[:, None], cache=cache)
    return sample(logits_B1V[:, 0], key, temperature, top_k, top_p), cache


def generate(
    model,
    prompt_BT,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    seed: int = 0,
    prefill_chunk: int | None = None,
    on_token: Callable[[jax.Array], None] | None = None,
    positions_BT=None,
    segment_ids_BT=None,
) -> jax.Array:
    """The prompt followed by up to max_new_tokens sampled tokens, [B, T + generated].

    Runs an eval-mode copy of `model` (the caller's model is left as it is); temperature 0 is greedy.
    With `eos_id`, a row that samples it keeps emitting it, and generation stops once every row has.
    Rows are sampled independently (one batch). `on_token(tokens_B)` is called with each new step's tokens
    (to stream or to time them). `positions_BT` and `segment_ids_BT` of the prompt (e.g. left padding in a segment of
    its own, the prompt's positions from 0) are continued by every generated token, as prefill's cache does.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    graphdef, state = nnx.split(model)
    copy = nnx.merge(graphdef, state)
    copy.eval()
    graphdef, state = nnx.split(copy)
    prompt_BT = jnp.asarray(prompt_BT)
    keys = jax.random.split(jax.random.key(seed), max_new_tokens)
    sampling = dict(graphdef=graphdef, temperature=temperature, top_k=top_k, top_p=top_p)
    slots = prompt_BT.shape[1] + max_new_tokens
    token_B, cache = _prefill_and_sample(
        state, prompt_BT, keys[0], positions_BT, segment_ids_BT, slots=slots, chunk=prefill_chunk, **sampling
    )
    new_tokens = [token_B]
    if on_token is not None:
        on_token(token_B)
    for key in keys[1:]:
        if eos_id is not None and bool(jnp.all(token_B == eos_id)):
            break
        token_B, cache = _step(state, token_B, cache, key, **sampling)
        if eos_id is not None:
            token_B = jnp.where(new_tokens[-1] == eos_id, eos_id, token_B)
        new_tokens.append(token_B)
        if on_token is not None:
            on_token(token_B)
    return jnp.concatenate([prompt_BT, jnp.stack(new_tokens, axis=1).astype(prompt_BT.dtype)], axis=1)
