"""MQAR scoring (data.mqar): greedy per-query accuracy of a model at a length, on instances that are the
same at every length.

Glossary: B instances, L = T + 1 window tokens, T target positions, P queries per instance, V vocab.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from freeatten_jax.data import mqar
from freeatten_jax.evaluation.results import MqarLength


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _argmax(state, tokens_BT, *, graphdef):
    return jnp.argmax(nnx.merge(graphdef, state)(tokens_BT), axis=-1)


def query_hits(model, tokens_BL: np.ndarray, mask_BT: np.ndarray, tokens_per_batch: int = 16384) -> np.ndarray:
    """[B, P] bool: whether the model's most likely next token at each answer position is the answer."""
    graphdef, state = nnx.split(model)
    count, length = len(tokens_BL), tokens_BL.shape[1] - 1
    size = min(count, max(1, tokens_per_batch // length))
    padded_BL = np.concatenate([tokens_BL, np.zeros((-count % size, length + 1), tokens_BL.dtype)])  # one shape: one compile
    guesses_BT = np.concatenate(
        [np.asarray(_argmax(state, jnp.asarray(padded_BL[i : i + size, :-1]), graphdef=graphdef)) for i in range(0, count, size)]
    )[:count]
    hits_BT = guesses_BT == tokens_BL[:, 1:]
    return hits_BT[mask_BT].reshape(count, -1)


def accuracy_by_length(
    model, task: mqar.Task, train_len: int, multipliers, instances: int, seed: int, placements=("start",)
) -> list[MqarLength]:
    """One row per placement and multiplier: length, queries scored, accuracy (and on first-time queries), the
    per-instance accuracies (for paired statistics: instance i is the same pairs at every length and placement) and
    every query's hit, whether it repeats an earlier query's key and its distance to its pair."""
    rows = []
    for placement in placements:
        for m in multipliers:
            tokens_BL, mask_BT = mqar.batch(task, train_len, m * train_len, instances, seed, placement)
            repeated_BP, distance_BP = mqar.batch_query_facts(task, train_len, m * train_len, instances, seed, placement)
            hits_BP = query_hits(model, tokens_BL, mask_BT)
            rows.append(
                MqarLength(
                    m * train_len,
                    m,
                    int(hits_BP.size),
                    float(hits_BP.mean()),
                    hits_BP.mean(1).tolist(),
                    placement,
                    float(hits_BP[~repeated_BP].mean()),
                    hits_BP.astype(int).tolist(),
                    repeated_BP.astype(int).tolist(),
                    distance_BP.tolist(),
                )
            )
    return rows
