"""Attention analysis: per layer and head, entropy and maximum weight as N_i grows, and needle mass.

Glossary: B batch, T positions, R query rows of one chunk, H heads, K kv heads, D head dim,
N visible-key counts, U bucket of N (powers of two: [1, 2), [2, 4), ...).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from freeatten_jax import attention


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _layers_qk(state, tokens_BT, *, graphdef):
    """(q_BTHD, k_BTKD) of every layer from the model's own forward pass, in one compiled program."""
    return nnx.merge(graphdef, state).attention_qk(tokens_BT)[1]


def _layers(model, tokens_BT):
    """[(attention layer, q_BTHD, k_BTKD)] for each layer."""
    graphdef, state = nnx.split(model)
    return [(layer, q, k) for layer, (q, k) in zip(model.attention_layers, _layers_qk(state, tokens_BT, graphdef=graphdef))]


@functools.partial(jax.jit, static_argnames=("variant", "start", "stop"))
def _rows(q_BTHD, k_BTKD, options, *, variant, start, stop):
    """Weights of query rows [start, stop) over all keys: [B, H, R, T]."""
    rows = jnp.arange(start, stop)
    return attention.attention_weights(q_BTHD[:, start:stop], k_BTKD, k_BTKD, variant=variant, q_positions=rows, **options)


def row_weights(layer, q_BTHD, k_BTKD, start: int, stop: int) -> jax.Array:
    return _rows(q_BTHD, k_BTKD, layer.variant_options(), variant=layer.variant, start=start, stop=stop)


def entropy_and_max(model, tokens_BT, chunk: int = 256) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(entropy [layers, H, U], max weight [layers, H, U], bucket lower bounds [U]), averaged over
    batch and the causal rows whose N_i = i + 1 falls in each bucket."""
    t = tokens_BT.shape[1]
    bucket_T = np.floor(np.log2(np.arange(1, t + 1))).astype(int)
    buckets = np.arange(bucket_T.max() + 1)
    entropies, maxima = [], []
    for layer, q_BTHD, k_BTKD in _layers(model, tokens_BT):
        ent_HT, max_HT = [], []
        for start in range(0, t, chunk):
            w_BHRS = row_weights(layer, q_BTHD, k_BTKD, start, min(start + chunk, t))
            ent_HT.append(np.asarray(-jnp.sum(w_BHRS * jnp.log(jnp.where(w_BHRS > 0, w_BHRS, 1.0)), -1).mean(0)))
            max_HT.append(np.asarray(w_BHRS.max(-1).mean(0)))
        ent_HT, max_HT = np.concatenate(ent_HT, 1), np.concatenate(max_HT, 1)
        entropies.append(np.stack([ent_HT[:, bucket_T == u].mean(1) for u in buckets], 1))
        maxima.append(np.stack([max_HT[:, bucket_T == u].mean(1) for u in buckets], 1))
    return np.stack(entropies), np.stack(maxima), 2**buckets


def needle_mass(model, tokens_1T, needle: slice) -> np.ndarray:
    """Attention mass of the last query on the needle tokens, per layer and head: [layers, H]."""
    t = tokens_1T.shape[1]
    masses = []
    for layer, q_BTHD, k_BTKD in _layers(model, tokens_1T):
        w_BHRS = row_weights(layer, q_BTHD, k_BTKD, t - 1, t)
        masses.append(np.asarray(w_BHRS[0, :, 0, needle.start : needle.stop].sum(-1)))
    return np.stack(masses)


def ssmax_s(model) -> np.ndarray | None:
    """The learned SSMax s as [layers, H], or None for other variants."""
    options = [layer.variant_options() for layer in model.attention_layers]
    if "s" not in options[0]:
        return None
    return np.stack([np.asarray(o["s"]) for o in options])
