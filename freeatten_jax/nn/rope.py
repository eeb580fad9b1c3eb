"""Rotary position embedding (RoPE) with a configurable base theta and, for long-context checkpoints, a frequency scaling.

Glossary: B batch, T positions, H heads, D head dim (even), F = D // 2 rotated pairs.
Pairs are (x[..., f], x[..., f + F]) ("rotate half"); angles are position * freq_f, freq_f = theta^(-2f/D) rescaled
by the scaling (Hugging Face's rope_type: none, linear or llama3; SCALINGS).
The rotation runs in float32 and is cast back, so bf16 activations keep exact positions.
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Scaling:
    """How the frequencies are rescaled (a key of SCALINGS) and the fields that rescaling reads; the defaults of the
    fields are Llama 3.1's."""

    kind: str = "none"
    factor: float = 1.0  # linear, llama3: frequencies (llama3: the long-wavelength ones) divided by it
    low_freq_factor: float = 1.0  # llama3: wavelengths above original_len / low_freq_factor are divided by factor
    high_freq_factor: float = 4.0  # llama3: wavelengths below original_len / high_freq_factor are kept
    original_len: int = 8192  # llama3: the context length before scaling (original_max_position_embeddings)

    def __post_init__(self):
        if self.kind not in SCALINGS:
            raise ValueError(f"unknown RoPE scaling {self.kind!r}; valid: {', '.join(SCALINGS)}")


def _linear(freq_F: jax.Array, scaling: Scaling) -> jax.Array:
    """Position interpolation: every frequency divided by the factor."""
    return freq_F / scaling.factor


def _llama3(freq_F: jax.Array, scaling: Scaling) -> jax.Array:
    """Llama 3.1's: frequencies whose wavelength 2 pi / freq exceeds original_len / low_freq_factor are divided by the
    factor, those below original_len / high_freq_factor kept, those between blended linearly in original_len / wavelength
    (the blend weight, clipped to [0, 1], is 0 and 1 at the two bounds, so one expression covers the three bands)."""
    wavelength_F = 2 * jnp.pi / freq_F
    kept_F = (scaling.original_len / wavelength_F - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    kept_F = jnp.clip(kept_F, 0.0, 1.0)
    return (1 - kept_F) * freq_F / scaling.factor + kept_F * freq_F


SCALINGS: dict[str, Callable[[jax.Array, Scaling], jax.Array]] = {
    "none": lambda freq_F, scaling: freq_F,
    "linear": _linear,
    "llama3": _llama3,
}
NO_SCALING = Scaling()


def frequencies(head_dim: int, theta: float, scaling: Scaling = NO_SCALING) -> jax.Array:
    """The F angular frequencies theta^(-2f/D), rescaled by `scaling`, as float32."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    freq_F = theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    return SCALINGS[scaling.kind](freq_F, scaling)


def apply_rope(x_BTHD: jax.Array, positions_BT: jax.Array, theta: float, scaling: Scaling = NO_SCALING) -> jax.Array:
    """Rotates each head vector by its absolute position (positions [T] or [B, T])."""
    freq_F = frequencies(x_BTHD.shape[-1], theta, scaling)
    positions_BT = jnp.asarray(positions_BT, jnp.float32).reshape(-1, x_BTHD.shape[1])
    angle_BTF = positions_BT[..., None] * freq_F
    cos_BT1F, sin_BT1F = jnp.cos(angle_BTF)[:, :, None], jnp.sin(angle_BTF)[:, :, None]
    x1_BTHF, x2_BTHF = jnp.split(x_BTHD.astype(jnp.float32), 2, axis=-1)
    rotated_BTHD = jnp.concatenate([x1_BTHF * cos_BT1F - x2_BTHF * sin_BT1F, x2_BTHF * cos_BT1F + x1_BTHF * sin_BT1F], axis=-1)
    return rotated_BTHD.astype(x_BTHD.dtype)
