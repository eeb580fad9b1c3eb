"""Any variant as a Flax `attention_fn` (nnx.MultiHeadAttention, linen MultiHeadDotProductAttention).

Glossary: B batch, T queries, S keys, H heads, D head dim. Flax passes [batch..., T, H, D] arrays and
a mask broadcastable to [batch..., H, T, S]; that mask defines M exactly (N_i = its row sum, per head
if it is per head), Flax's KV-cache decoding included. What cannot be honoured raises ValueError.
"""

import math

import jax
import jax.numpy as jnp

from freeatten_jax.attention import api
from freeatten_jax.attention.variants import get_variant


def _dense_mask(mask, batch: tuple[int, ...], t: int, s: int) -> jax.Array:
    """Flax's mask (bool or 0/1) as [B or 1, H or 1, T, S] bool."""
    mask = jnp.asarray(mask).astype(bool)
    mask = mask.reshape((1,) * (len(batch) + 3 - mask.ndim) + mask.shape)
    leading = batch if math.prod(mask.shape[:-3]) > 1 else mask.shape[:-3]
    shape = (*leading, mask.shape[-3], t, s)
    return jnp.broadcast_to(mask, shape).reshape(-1, *shape[-3:])


def flax_attention_fn(variant: str, **options):
    """A function with Flax's `dot_product_attention` signature computing `variant`.

    options: any `attend` option except the mask's (s, b, p, scale, implementation, block sizes).
    Flax's `mask` and `is_causal` (causal from the first key, as in Flax) define M. An additive
    `bias` is honoured for softmax only (through jax.nn.dot_product_attention); attention dropout,
    sown weights and custom einsums are refused. Math is float32 whatever `precision` says."""
    get_variant(variant)
    given_mask = sorted(set(options) & {"causal", "mask", "q_positions", "kv_positions", "q_offset", "kv_mask"})
    if given_mask:
        raise ValueError(f"flax_attention_fn takes no mask option {given_mask}: Flax's mask and is_causal define it")

    def attention_fn(
        query,
        key,
        value,
        bias=None,
        mask=None,
        broadcast_dropout=True,
        dropout_rng=None,
        dropout_rate=0.0,
        deterministic=False,
        dtype=None,
        precision=None,
        module=None,
        is_causal=False,
        force_fp32_for_softmax=False,
        qk_attn_weights_einsum=None,
        attn_weights_value_einsum=None,
    ):
        if dropout_rate > 0 and not deterministic:
            raise ValueError("attention dropout is not supported by flax_attention_fn: use dropout_rate=0 or deterministic=True")
        if module is not None:
            raise ValueError("sow_weights is not supported by flax_attention_fn: use attention.attention_weights")
        if qk_attn_weights_einsum is not None or attn_weights_value_einsum is not None:
            raise ValueError("flax_attention_fn does not support custom attention einsums")
        if bias is not None and variant != "softmax":
            raise ValueError(f"an additive bias can only be honoured by variant 'softmax', not {variant!r}: use a boolean mask")
        dtype = dtype or jnp.result_type(query, key, value)
        batch, (t, h, _), s = query.shape[:-3], query.shape[-3:], key.shape[-3]
        q_BTHD, k_BSKD, v_BSKD = (jnp.asarray(x, dtype).reshape(-1, *x.shape[-3:]) for x in (query, key, value))
        dense = None if mask is None else _dense_mask(mask, batch, t, s)
        if bias is not None:
            bias_BHTS = jnp.broadcast_to(bias, (*batch, h, t, s)).reshape(-1, h, t, s)
            scale = options.get("scale")
            out_BTHD = jax.nn.dot_product_attention(q_BTHD, k_BSKD, v_BSKD, bias_BHTS, dense, scale=scale, is_causal=is_causal)
        else:
            causal = dict(causal=True, q_offset=0) if is_causal and t != s else dict(causal=bool(is_causal))
            out_BTHD = api.attend(q_BTHD, k_BSKD, v_BSKD, variant=variant, mask=dense, **causal, **options)
        return out_BTHD.reshape(*batch, t, h, out_BTHD.shape[-1])

    return attention_fn
