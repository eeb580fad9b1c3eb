"""Sampling with a KV cache: prefill the prompt (optionally in chunks), then one jitted step per token.

Glossary: B batch, T prompt length, C chunk length, V vocabulary.
Cache slots hold absolute positions, so N_i in ssmax/lssa/lssar is the query's position + 1,
exactly as in a full forward pass over the same tokens.
"""
import functools

import jax
import jax.numpy as jnp
from flax import nnx


def prefill(model, tokens_BT, cache, *, chunk: int | None = None, positions_BT=None, segment_ids_BT=None):
    """(logits_BTV, cache) after appending the prompt, `chunk` tokens at a time (None: all at once).

    Chunking bounds attention memory to C x cache slots for prompts far longer than one block.
    """
    t = tokens_BT.shape[1]
    chunk = chunk or t
    pieces = []
    for start in range(0, t, chunk):
        part = slice(start, start + chunk)
        positions = None if positions_BT is None else positions_BT[:, part]
        segments = None if segment_ids_BT is None else segment_ids_BT[:, part]
        logits_BCV, cache = model.decode(tokens_BT[:, part], cache, positions_BT=positions, segment_ids_BT=segments)
        pieces.append(logits_BCV)
    return jnp.concatenate(pieces, axis=1), cache


def sample(logits_BV, key, temperature: float, top_k: int | None) -> jax.Array:
    """Next tokens [B]: greedy when temperature == 0, else from softmax(logits / temperature) over the top k."""
    if temperature == 0:
        return jnp.argmax(logits_BV, axis=-1)
    logits_BV = logits_BV / temperature
    if top_k is not None:
        kth_B1 = jax.lax.top_k(logits_BV, top_k)[0][:, -1:]
        logits_BV = jnp.where(logits_BV < kth_B1, -jnp.inf, logits_BV)
    return jax.random.categorical(key, logits_BV, axis=-1)


@functools.partial(jax.jit, static_argnames=("graphdef", "chunk", "temperature", "top_k"), donate_argnames=("cache",))
def _prefill_and_sample(graphdef, state, tokens_BT, cache, key, *, chunk, temperature, top_k):
    logits_BTV, cache = prefill(nnx.merge(graphdef, state), tokens_BT, cache, chunk=chunk)
    return sample(logits_BTV[:, -1], key, temperature, top_k), cache


@functools.partial(jax.jit, static_argnames=("graphdef", "temperature", "top_k"), donate_argnames=("cache",))
def _step(graphdef, state, token_B, cache, key, *, temperature, top_k):
    logits_B1V, cache = nnx.merge(graphdef, state).decode(token_B[:, None], cache)
    return sample(logits_B1V[:, 0], key, temperature, top_k), cache


def generate(
    model,
    prompt_BT,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    prefill_chunk: int | None = None,
) -> jax.Array:
    """The prompt followed by max_new_tokens sampled tokens, [B, T + max_new_tokens].

    Runs an eval-mode copy of `model` (the caller's model is left as it is); temperature 0 is greedy.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    graphdef, state = nnx.split(model)
    copy = nnx.merge(graphdef, state)
    copy.eval()
    graphdef, state = nnx.split(copy)
    prompt_BT = jnp.asarray(prompt_BT)
    cache = copy.init_cache(prompt_BT.shape[0], prompt_BT.shape[1] + max_new_tokens)
    keys = jax.random.split(jax.random.key(seed), max_new_tokens)
    sampling = dict(temperature=temperature, top_k=top_k)
    token_B, cache = _prefill_and_sample(graphdef, state, prompt_BT, cache, keys[0], chunk=prefill_chunk, **sampling)
    new_tokens = [token_B]
    for key in keys[1:]:
        token_B, cache = _step(graphdef, state, token_B, cache, key, **sampling)
        new_tokens.append(token_B)
    return jnp.concatenate([prompt_BT, jnp.stack(new_tokens, axis=1).astype(prompt_BT.dtype)], axis=1)
