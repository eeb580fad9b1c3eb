"""Next-token loss on held-out windows cut from one token span: mean, over the last training-length
positions, per position, and a bootstrap confidence interval over windows.

Glossary: W windows, L = T + 1 window tokens (inputs and shifted targets), T positions, V vocab.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from freeatten_jax import data
from freeatten_jax.training.loss import next_token_losses


@functools.partial(jax.jit, static_argnames=("graphdef", "eos_id"))
def _losses(state, tokens_WL, *, graphdef, eos_id):
    return next_token_losses(nnx.merge(graphdef, state), tokens_WL, eos_id=eos_id)


def token_losses(model, windows_WL: np.ndarray, tokens_per_batch: int = 16384, eos_id: int | None = None) -> np.ndarray:
    """Per-position losses [W, T] in float32, in batches of about tokens_per_batch tokens; `eos_id` as in
    training (document masking), so that 1x equals training's val_loss on document-masked runs too."""
    graphdef, state = nnx.split(model)
    count = len(windows_WL)
    batch = min(count, max(1, tokens_per_batch // windows_WL.shape[1]))
    padded_WL = np.concatenate(
        [windows_WL, np.zeros((-count % batch, windows_WL.shape[1]), windows_WL.dtype)]
    )  # one shape: one compile
    parts = [
        np.asarray(_losses(state, jnp.asarray(padded_WL[i : i + batch]), graphdef=graphdef, eos_id=eos_id))
        for i in range(0, count, batch)
    ]
    return np.concatenate(parts)[:count]


def span(sequences, tokens: int) -> list:
    """The first `tokens` tokens of the held-out sequences (in order), as a list of sequences."""
    out, left = [], tokens
    for s in sequences:
        if left <= 0:
            break
        out.append(np.asarray(s[: min(len(s), left)]))
        left -= len(out[-1])
    return out


def span_windows(sequences, length: int, tokens: int) -> np.ndarray:
    """Every non-overlapping window [W, length + 1] inside the span of the first `tokens` held-out tokens.

    Windows are cut in order, as training's validation cuts them (data.eval_windows), so at the training
    length a span of eval_windows * (seq_len + 1) tokens gives training's own validation windows."""
    return data.eval_windows(span(sequences, tokens), length)


def bootstrap_ci(values_W: np.ndarray, seed: int = 0, resamples: int = 1000, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-window values (windows resampled with replacement)."""
    values_W = np.asarray(values_W, np.float64)
    index_RW = np.random.default_rng(seed).integers(len(values_W), size=(resamples, len(values_W)))
    means_R = values_W[index_RW].mean(1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(means_R, tail)), float(np.percentile(means_R, 100 - tail))


def summarise(losses_WT: np.ndarray, train_len: int, seed: int = 0) -> dict:
    """Mean loss over all positions and over the last train_len positions of each window, each with a
    95% bootstrap interval over windows, and the number of tokens scored."""
    windows_W, last_W = losses_WT.mean(1), losses_WT[:, -train_len:].mean(1)
    return {
        "loss": float(losses_WT.mean()),
        "loss_ci": bootstrap_ci(windows_W, seed),
        "loss_last_train_len": float(last_W.mean()),  # windows have equal lengths: the mean of all those positions
        "loss_last_train_len_ci": bootstrap_ci(last_W, seed),
        "per_window": windows_W.tolist(),  # for paired comparisons (every run scores the same windows)
        "windows": int(losses_WT.shape[0]),
        "tokens_scored": int(losses_WT.size),
    }
