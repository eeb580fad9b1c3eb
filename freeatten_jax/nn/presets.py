"""Model sizes (docs/method.md §5) as `ModelConfig`s: the shape of the network only.

tiny: trains on a CPU in minutes (byte vocabulary). gpt2_small: the LSSA paper's GPT-2 small with
RoPE instead of learned positions (~124M, tied). ssmax_162m: the SSMax paper's model (~162M: gated
FFN 2048, untied, vocab 50,257). The attention variant and the training length are the caller's.
"""

from typing import Any

from freeatten_jax.errors import ConfigError
from freeatten_jax.nn.config import ModelConfig

SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=256, num_layers=4, num_heads=4, d_model=128, mlp_dim=512),
    "gpt2_small": dict(vocab_size=50257, num_layers=12, num_heads=12, d_model=768, mlp_dim=3072, use_bias=True, dtype="bfloat16"),
    "ssmax_162m": dict(
        vocab_size=50257,
        num_layers=12,
        num_heads=12,
        d_model=768,
        mlp_dim=2048,
        mlp="swiglu",
        norm="rmsnorm",
        tie_embeddings=False,
        dtype="bfloat16",
    ),
}


def preset(size: str, **overrides) -> ModelConfig:
    """The model of `size` (tiny, gpt2_small, ssmax_162m) with `overrides`, e.g. attention="lssar", max_len=1024."""
    if size not in SIZES:
        raise ConfigError(f"unknown model size {size!r}; valid sizes: {', '.join(SIZES)}")
    return ModelConfig(**{**SIZES[size], **overrides})
