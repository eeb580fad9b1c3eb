"""Log-likelihoods of candidate continuations after one prompt, scored whole or over a mesh's 'context' axis: how the
retrieval evaluations (passkey, the RULER-style suite) rank a true answer among wrong ones.

Glossary: C candidates, L tokens of a prompt and a candidate, T prompt tokens.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from freeatten_jax.attention import mesh_axes
from freeatten_jax.nn import sharding
from freeatten_jax.training.loss import next_token_losses


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _token_log_probs(state, tokens_CL, *, graphdef):
    """log p(token_l | tokens_<l) for l >= 1: [C, L - 1]."""
    return -next_token_losses(nnx.merge(graphdef, state), tokens_CL)


def continuations(model, prompt_T: np.ndarray, candidates: list[np.ndarray], mesh) -> np.ndarray:
    """Total log-likelihood of each candidate's tokens after the prompt: [C]. Over a 'context' axis of n devices
    the inputs are padded at the end to a multiple of 2n (the ring's chunks): causal attention keeps that padding out
    of every log-likelihood read."""
    graphdef, state = nnx.split(model)
    devices = mesh.shape[mesh_axes.CONTEXT]
    ring = mesh_axes.CHUNKS_PER_DEVICE * devices if devices > 1 else 1
    totals = np.zeros(len(candidates))
    for size in sorted({len(c) for c in candidates}):  # candidates of one token length form one batch
        index = [i for i, c in enumerate(candidates) if len(c) == size]
        tokens_CL = np.stack([np.concatenate([prompt_T, candidates[i]]) for i in index]).astype(np.int32)
        length = tokens_CL.shape[1]
        padded_CL = np.pad(tokens_CL, ((0, 0), (0, -(length - 1) % ring)))
        with sharding.use_mesh(mesh, sharding.DEFAULT_RULES):
            log_probs = np.asarray(_token_log_probs(state, jnp.asarray(padded_CL), graphdef=graphdef))
        totals[index] = log_probs[:, len(prompt_T) - 1 : length - 1].sum(-1)
    return totals
