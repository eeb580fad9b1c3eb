"""The token loss, the one definition used by training, validation and evaluation.

Glossary: B batch, L = T + 1 window tokens (inputs tokens[:, :-1], targets tokens[:, 1:]), T positions, V vocab.
"""

import jax
import jax.numpy as jnp

from freeatten_jax.data import documents


def next_token_losses(model, tokens_BL, *, eos_id: int | None = None, **model_kwargs) -> jax.Array:
    """Cross-entropy -log p(tokens[:, t + 1] | tokens[:, :t + 1]) per position: [B, T] float32.

    With `eos_id` (document masking), attention, N_i and RoPE restart at each EOS-opened document
    (data.documents); every target keeps its loss, since none is predicted from another document.
    """
    logits_BTV = model(tokens_BL[:, :-1], **documents.model_inputs(tokens_BL[:, :-1], eos_id), **model_kwargs)
    target_BT = jnp.take_along_axis(logits_BTV, tokens_BL[:, 1:, None], axis=-1)[..., 0]
    return jax.nn.logsumexp(logits_BTV, axis=-1) - target_BT
