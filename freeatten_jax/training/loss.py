"""The token loss, the one definition used by training, validation and evaluation.

Glossary: B batch, L = T + 1 window tokens (inputs tokens[:, :-1], targets tokens[:, 1:]), T positions, V vocab.
"""
import jax
import jax.numpy as jnp


def next_token_losses(model, tokens_BL, **model_kwargs) -> jax.Array:
    """Cross-entropy -log p(tokens[:, t + 1] | tokens[:, :t + 1]) per position: [B, T] float32."""
    logits_BTV = model(tokens_BL[:, :-1], **model_kwargs)
    target_BT = jnp.take_along_axis(logits_BTV, tokens_BL[:, 1:, None], axis=-1)[..., 0]
    return jax.nn.logsumexp(logits_BTV, axis=-1) - target_BT
