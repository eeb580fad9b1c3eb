"""The token loss, the one definition used by training, validation and evaluation.

Glossary: B batch, L = T + 1 window tokens (inputs tokens[:, :-1], targets tokens[:, 1:]), T positions, V vocab,
E model width, n loss chunks, R = T / n positions per chunk.
"""

import jax
import jax.numpy as jnp

from freeatten_jax.data import documents
from freeatten_jax.nn.transformer import unembed

# Above this many logits (B·T·V over all devices; 2^28 float32 = 1 GiB) the loss is taken in chunks of the
# sequence, each chunk's logits recomputed in the backward instead of kept: memory stops growing with T·V.
MAX_LOGITS = 2**28


def chunk_count(t: int, logits: int, max_logits: int) -> int:
    """The fewest chunks n, a divisor of t, that keep each chunk's logits within max_logits."""
    return next(n for n in range(min(-(-logits // max_logits), t), t + 1) if t % n == 0)


def next_token_losses(model, tokens_BL, *, eos_id: int | None = None, max_logits: int | None = None, **model_kwargs):
    """Cross-entropy -log p(tokens[:, t + 1] | tokens[:, :t + 1]) per position: [B, T] float32.

    With `eos_id` (document masking), attention, N_i and RoPE restart at each EOS-opened document
    (data.documents); every target keeps its loss, since none is predicted from another document. Above
    max_logits (default MAX_LOGITS) logits, chunk k takes the positions t with t % n == k (strided: a sequence sharded over
    devices keeps each chunk spread evenly over them) under jax.checkpoint.
    """
    inputs_BT, targets_BT = tokens_BL[:, :-1], tokens_BL[:, 1:]
    x_BTE = model.features(inputs_BT, **documents.model_inputs(inputs_BT, eos_id), **model_kwargs)
    w_EV = model.unembedding()
    (b, t), v = inputs_BT.shape, w_EV.shape[1]
    n = chunk_count(t, b * t * v, max_logits or MAX_LOGITS)
    if n == 1:
        return _losses(unembed(x_BTE, w_EV), targets_BT)
    x_BRnE = x_BTE.reshape(b, t // n, n, -1)

    @jax.checkpoint
    def chunk(xs):
        x_BRE, targets_BR = xs
        return _losses(unembed(x_BRE, w_EV), targets_BR)

    losses_nBR = jax.lax.map(chunk, (x_BRnE.transpose(2, 0, 1, 3), targets_BT.reshape(b, t // n, n).transpose(2, 0, 1)))
    return losses_nBR.transpose(1, 2, 0).reshape(b, t)


def _losses(logits_BTV, targets_BT):
    target_BT = jnp.take_along_axis(logits_BTV, targets_BT[..., None], axis=-1)[..., 0]
    return jax.nn.logsumexp(logits_BTV, axis=-1) - target_BT
