"""Rotary position embedding (RoPE) with a configurable base theta.

Glossary: B batch, T positions, H heads, D head dim (even), F = D // 2 rotated pairs.
Pairs are (x[..., f], x[..., f + F]) ("rotate half"); angles are position * theta^(-2f/D).
The rotation runs in float32 and is cast back, so bf16 activations keep exact positions.
"""

import jax
import jax.numpy as jnp


def frequencies(head_dim: int, theta: float) -> jax.Array:
    """The F angular frequencies theta^(-2f/D) as float32."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    return theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)


def apply_rope(x_BTHD: jax.Array, positions_BT: jax.Array, theta: float) -> jax.Array:
    """Rotates each head vector by its absolute position (positions [T] or [B, T])."""
    freq_F = frequencies(x_BTHD.shape[-1], theta)
    positions_BT = jnp.asarray(positions_BT, jnp.float32).reshape(-1, x_BTHD.shape[1])
    angle_BTF = positions_BT[..., None] * freq_F
    cos_BT1F, sin_BT1F = jnp.cos(angle_BTF)[:, :, None], jnp.sin(angle_BTF)[:, :, None]
    x1_BTHF, x2_BTHF = jnp.split(x_BTHD.astype(jnp.float32), 2, axis=-1)
    rotated_BTHD = jnp.concatenate([x1_BTHF * cos_BT1F - x2_BTHF * sin_BT1F, x2_BTHF * cos_BT1F + x1_BTHF * sin_BT1F], axis=-1)
    return rotated_BTHD.astype(x_BTHD.dtype)
