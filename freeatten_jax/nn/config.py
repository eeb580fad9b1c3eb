"""`ModelConfig`: the typed, frozen description of a `Transformer`; every model check lives here.

Invalid fields raise `ConfigError` (a ValueError) naming the field and its allowed values.
"""
import dataclasses
import math
from typing import Any, Literal, get_args

import jax.numpy as jnp

from freeatten_jax import attention
from freeatten_jax.errors import ConfigError

DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
LEARNED_OPTIONS = ("s", "b")  # ssmax options held as parameters, never passed by the user
Mlp = Literal["gelu", "swiglu"]
Norm = Literal["layernorm", "rmsnorm"]
Remat = Literal["none", "dots", "full"]


def check_attention(variant: str, options: dict[str, Any]) -> None:
    """Raises ConfigError on an unknown variant or an option the variant does not take (learned s/b included)."""
    try:
        spec = attention.get_variant(variant)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    allowed = [name for name in spec.defaults if name not in LEARNED_OPTIONS]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(f"attention variant {variant!r} got unknown option(s) {unknown}; it accepts: {allowed or 'none'}")


def _int(low: int):
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low), f"an int >= {low}"


def _number(ok, text):
    return (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and ok(v)), text


def _one_of(choices):
    return (lambda v: v in choices), "one of " + ", ".join(map(repr, choices))


def _dtype(v) -> bool:
    try:
        return jnp.dtype(v) in DTYPES
    except TypeError:
        return False


_BOOL = ((lambda v: isinstance(v, bool)), "True, False")

# field -> (check, allowed values as shown in the error)
_CHECKS = {
    "vocab_size": _int(1),
    "num_layers": _int(1),
    "num_heads": _int(1),
    "d_model": _int(1),
    "mlp_dim": _int(1),
    "num_kv_heads": _int(0),
    "max_len": _int(2),
    "attention": _one_of(tuple(attention.VARIANTS)),
    "attention_options": ((lambda v: isinstance(v, dict)), "a dict of the variant's options"),
    "implementation": _one_of(tuple(attention.IMPLEMENTATIONS)),
    "mlp": _one_of(get_args(Mlp)),
    "norm": _one_of(get_args(Norm)),
    "tie_embeddings": _BOOL,
    "use_bias": _BOOL,
    "dropout": _number(lambda v: 0 <= v < 1, "a rate in [0, 1)"),
    "remat": _one_of(get_args(Remat)),
    "dtype": (_dtype, "one of 'float32', 'bfloat16'"),
    "param_dtype": (_dtype, "one of 'float32', 'bfloat16'"),
    "rope_theta": _number(lambda v: v > 0, "a number > 0"),
    "ssmax_s_init": ((lambda v: v is None or (isinstance(v, (int, float)) and v > 0)), "None (= 1/log(max_len)) or > 0"),
    "ssmax_bias": _BOOL,
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer. Sizes first; the rest has the defaults of the papers' GPT-2 runs."""

    vocab_size: int
    num_layers: int
    num_heads: int
    d_model: int
    mlp_dim: int
    num_kv_heads: int = 0  # 0: as many as num_heads (else a divisor of it: grouped-query attention)
    max_len: int = 1024  # the training length; sets SSMax's initial s
    attention: str = "softmax"  # a name in attention.VARIANTS
    attention_options: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. {"p": 15.0} for lssar
    implementation: str = "auto"  # a name in attention.IMPLEMENTATIONS
    mlp: Mlp = "gelu"
    norm: Norm = "layernorm"
    tie_embeddings: bool = True
    use_bias: bool = False
    dropout: float = 0.0
    remat: Remat = "none"  # none: no rematerialisation; dots: keep matmul outputs; full: keep nothing
    dtype: Any = jnp.float32  # compute dtype
    param_dtype: Any = jnp.float32
    rope_theta: float = 10_000.0
    ssmax_s_init: float | None = None  # None: 1/log(max_len), so s log N_i starts at 1 at the training length
    ssmax_bias: bool = False  # a learnable per-head b in (s log N_i + b)

    def __post_init__(self):
        for field, (ok, allowed) in _CHECKS.items():
            if not ok(value := getattr(self, field)):
                raise ConfigError(f"model.{field}={value!r} is invalid; allowed: {allowed}")
        if self.num_kv_heads and self.num_heads % self.num_kv_heads:
            raise ConfigError(f"model.num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
        if self.d_model % self.num_heads or (self.d_model // self.num_heads) % 2:
            raise ConfigError(f"model.d_model={self.d_model} must split into num_heads={self.num_heads} even head dims")
        check_attention(self.attention, self.attention_options)
        for field in ("dtype", "param_dtype"):  # names ("bfloat16") or dtypes in, numpy dtypes stored
            object.__setattr__(self, field, jnp.dtype(getattr(self, field)))

    def replace(self, **changes) -> "ModelConfig":
        """A copy with `changes` applied (and checked)."""
        return dataclasses.replace(self, **changes)

    @property
    def initial_ssmax_s(self) -> float:
        return 1.0 / math.log(self.max_len) if self.ssmax_s_init is None else float(self.ssmax_s_init)
