"""The reusable NNX library: attention layer, transformer, RoPE, logical-axis parameters, sharding,
generation; configured by a typed `ModelConfig`. Needs only jax, flax and numpy."""

from freeatten_jax.nn.attention_layer import Attention, KVCache
from freeatten_jax.nn.config import ModelConfig
from freeatten_jax.nn.decoding import generate
from freeatten_jax.nn.presets import preset
from freeatten_jax.nn.transformer import Transformer

__all__ = ["Attention", "KVCache", "ModelConfig", "Transformer", "generate", "preset"]
