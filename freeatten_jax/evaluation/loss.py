"""Next-token loss on held-out windows: mean, over the last training-length positions, and per position.

Glossary: W windows, L = T + 1 window tokens (inputs and shifted targets), T positions, V vocab.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from freeatten_jax.training.loss import next_token_losses


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _losses(state, tokens_WL, *, graphdef):
    return next_token_losses(nnx.merge(graphdef, state), tokens_WL)


def token_losses(model, windows_WL: np.ndarray, tokens_per_batch: int = 16384) -> np.ndarray:
    """Per-position losses [W, T] in float32, in batches of about tokens_per_batch tokens."""
    graphdef, state = nnx.split(model)
    count = len(windows_WL)
    batch = min(count, max(1, tokens_per_batch // windows_WL.shape[1]))
    padded_WL = np.concatenate([windows_WL, np.zeros((-count % batch, windows_WL.shape[1]), windows_WL.dtype)])  # one shape: one compile
    parts = [np.asarray(_losses(state, jnp.asarray(padded_WL[i : i + batch]), graphdef=graphdef)) for i in range(0, count, batch)]
    return np.concatenate(parts)[:count]


def summarise(losses_WT: np.ndarray, train_len: int) -> dict:
    """Mean loss over all positions and over the last train_len positions of each window."""
    return {
        "loss": float(losses_WT.mean()),
        "loss_last_train_len": float(losses_WT[:, -train_len:].mean()),
        "windows": int(losses_WT.shape[0]),
    }
