"""`ModelConfig`: the typed, frozen description of a `Transformer`; each field declared once with its help and check.

Invalid fields raise `ConfigError` (a ValueError) naming the field and its allowed values.
"""

import dataclasses
import math
from typing import Any, Literal, get_args

import jax.numpy as jnp
import numpy as np

from freeatten_jax import attention
from freeatten_jax.errors import ConfigError
from freeatten_jax.nn.rope import SCALINGS, Scaling
from freeatten_jax.schema import BOOL, FINITE_POSITIVE, POSITIVE, integer, number, one_of, option, optional, validate

DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
LEARNED_OPTIONS = ("s", "b")  # ssmax options held as parameters, never passed by the user
Mlp = Literal["gelu", "swiglu"]
Norm = Literal["layernorm", "rmsnorm"]
Remat = Literal["none", "dots", "full"]
DType = str | np.dtype  # a name ("bfloat16") in, a numpy dtype stored


def check_attention(variant: str, options: dict[str, Any], num_heads: int | None = None) -> None:
    """Raises ConfigError on an unknown variant, an option the variant does not take (learned s/b included) or a
    bad option value (lssar p <= 0 or NaN, ...)."""
    try:
        spec = attention.get_variant(variant)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    allowed = [name for name in spec.defaults if name not in LEARNED_OPTIONS]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(f"attention variant {variant!r} got unknown option(s) {unknown}; it accepts: {allowed or 'none'}")
    try:
        attention.variant_options(variant, options, num_heads)
    except ValueError as e:
        raise ConfigError(f"model.attention_options: {e}") from None


def _dtype(v) -> bool:
    try:
        return jnp.dtype(v) in DTYPES
    except TypeError:
        return False


_DTYPE = (_dtype, "one of 'float32', 'bfloat16'")
_OPTIONS = ((lambda v: isinstance(v, dict)), "a dict of the variant's options")
_VARIANTS = one_of(tuple(attention.VARIANTS))  # named here: the field `attention` hides the module in the class body
_IMPLEMENTATIONS = one_of(tuple(attention.IMPLEMENTATIONS))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer. Sizes first; the rest has the defaults of the papers' GPT-2 runs."""

    vocab_size: int = option(help="tokens are ids in [0, vocab_size)", check=integer(1))
    num_layers: int = option(help="transformer blocks", check=integer(1))
    num_heads: int = option(help="query heads", check=integer(1))
    d_model: int = option(help="residual width; d_model / num_heads is the (even) head dimension", check=integer(1))
    mlp_dim: int = option(help="hidden width of each block's MLP", check=integer(1))
    num_kv_heads: int = option(
        0, help="0: as many as num_heads, else a divisor of it (grouped-query attention)", check=integer(0)
    )
    max_len: int = option(1024, help="the training length; sets SSMax's initial s", check=integer(2))
    attention: str = option("softmax", help="the attention variant", check=_VARIANTS)
    attention_options: dict[str, Any] = option(
        help="the variant's options, e.g. {'p': 15.0} for lssar", check=_OPTIONS, factory=dict
    )
    implementation: str = option("auto", help="how attention is computed", check=_IMPLEMENTATIONS)
    mlp: Mlp = option("gelu", help="the MLP's activation (swiglu: gated)", check=one_of(get_args(Mlp)))
    norm: Norm = option("layernorm", help="the normalisation before attention and MLP", check=one_of(get_args(Norm)))
    norm_eps: float | None = option(
        None, help="the norm's epsilon; None: the norm's own (layernorm 1e-5, rmsnorm 1e-6)", check=optional(POSITIVE)
    )
    tie_embeddings: bool = option(True, help="the output projection is the embedding table", check=BOOL)
    use_bias: bool = option(False, help="biases in the projections", check=BOOL)
    qkv_bias: bool = option(False, help="biases in the q, k and v projections only (Qwen2's)", check=BOOL)
    window: int | None = option(
        None,
        help="sliding-window attention: a query sees the keys fewer than this many positions back (Mistral's "
        "sliding_window); None: every earlier key",
        check=optional(integer(1)),
    )
    dropout: float = option(0.0, help="dropout rate", check=number(lambda v: 0 <= v < 1, "a rate in [0, 1)"))
    remat: Remat = option(
        "none", help="rematerialisation: none; dots (keep matmul outputs); full (keep nothing)", check=one_of(get_args(Remat))
    )
    dtype: DType = option(jnp.float32, help="compute dtype", check=_DTYPE)
    param_dtype: DType = option(jnp.float32, help="parameter dtype", check=_DTYPE)
    rope_theta: float = option(10_000.0, help="RoPE base", check=POSITIVE)
    rope_scaling: str = option(
        "none",
        help="RoPE frequency scaling (Hugging Face's rope_type): none; linear (every frequency / rope_factor); llama3 "
        "(Llama 3.1's: long wavelengths / rope_factor, short ones kept, a blend between)",
        check=one_of(tuple(SCALINGS)),
    )
    rope_factor: float = option(1.0, help="linear, llama3: the factor frequencies are divided by", check=FINITE_POSITIVE)
    rope_low_freq_factor: float = option(
        1.0, help="llama3: wavelengths above rope_original_len / this are divided by rope_factor", check=FINITE_POSITIVE
    )
    rope_high_freq_factor: float = option(
        4.0, help="llama3: wavelengths below rope_original_len / this are kept (> rope_low_freq_factor)", check=FINITE_POSITIVE
    )
    rope_original_len: int = option(
        8192, help="llama3: the context length before scaling (original_max_position_embeddings)", check=integer(1)
    )
    ssmax_s_init: float | None = option(
        None,
        help="SSMax's initial s; None: 1/log(max_len), so s log N_i starts at 1 at the training length",
        check=optional(POSITIVE),
    )
    ssmax_bias: bool = option(False, help="a learnable per-head b in (s log N_i + b)", check=BOOL)
    ssmax_learn_s: bool = option(
        True,
        help="False: s stays at its initial value (with s_init None and no bias: softmax with "
        "the fixed temperature log N_i / log max_len, the softmax_logn control)",
        check=BOOL,
    )

    def __post_init__(self):
        validate(ModelConfig, vars(self), "model.")
        if self.num_kv_heads and self.num_heads % self.num_kv_heads:
            raise ConfigError(f"model.num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
        if self.d_model % self.num_heads or (self.d_model // self.num_heads) % 2:
            raise ConfigError(f"model.d_model={self.d_model} must split into num_heads={self.num_heads} even head dims")
        if self.rope_scaling == "llama3" and self.rope_high_freq_factor <= self.rope_low_freq_factor:
            raise ConfigError(
                f"model.rope_high_freq_factor={self.rope_high_freq_factor} must exceed "
                f"model.rope_low_freq_factor={self.rope_low_freq_factor} (llama3 blends between them)"
            )
        check_attention(self.attention, self.attention_options, self.num_heads)
        for field in ("dtype", "param_dtype"):  # names ("bfloat16") or dtypes in, numpy dtypes stored
            object.__setattr__(self, field, jnp.dtype(getattr(self, field)))

    def replace(self, **changes) -> "ModelConfig":
        """A copy with `changes` applied (and checked)."""
        return dataclasses.replace(self, **changes)

    @property
    def variant_name(self) -> str:
        """The variant as reports name it: `softmax_logn` for SSMax with s fixed at its initial value and no b;
        `lssa_fixed` / `lssar_fixed` for LSSA / LSSAR with the temperature frozen at one length."""
        if self.attention == "ssmax" and not self.ssmax_learn_s and not self.ssmax_bias:
            return "softmax_logn"
        if dict(self.attention_options).get("temperature_length") is not None:
            return f"{self.attention}_fixed"
        return self.attention

    @property
    def rope_frequency_scaling(self) -> Scaling:
        """The rope_* fields as the RoPE frequency scaling every attention layer applies."""
        return Scaling(
            self.rope_scaling, self.rope_factor, self.rope_low_freq_factor, self.rope_high_freq_factor, self.rope_original_len
        )

    @property
    def initial_ssmax_s(self) -> float:
        return 1.0 / math.log(self.max_len) if self.ssmax_s_init is None else float(self.ssmax_s_init)
