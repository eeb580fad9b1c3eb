"""Length-extrapolating attention as pure functions: `attend` and `attention_weights` (docs/method.md §4).

Glossary: B batch, T queries, S keys, H query heads, K key/value heads, D head dim.
`variant` names what is computed (VARIANTS); `implementation` names how (IMPLEMENTATIONS).
"""

from freeatten_jax.attention.api import IMPLEMENTATIONS, attend, attention_weights, implementation_options
from freeatten_jax.attention.arguments import make_mask
from freeatten_jax.attention.context_parallel import context_parallel_attend
from freeatten_jax.attention.flax_adapter import flax_attention_fn
from freeatten_jax.attention.sharded_decode import sharded_decode_attend
from freeatten_jax.attention.variants import VARIANTS, Mask, Variant, get_variant, variant_options

__all__ = [
    "attend",
    "attention_weights",
    "implementation_options",
    "flax_attention_fn",
    "make_mask",
    "get_variant",
    "variant_options",
    "Mask",
    "Variant",
    "VARIANTS",
    "IMPLEMENTATIONS",
    "context_parallel_attend",
    "sharded_decode_attend",
]
