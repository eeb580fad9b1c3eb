"""A decoder-only transformer in Flax NNX with pluggable attention (any `attention.VARIANTS`).

Glossary: B batch, T positions, S cache slots, E d_model, F mlp_dim, V vocabulary.
Pre-norm blocks: x + Attention(Norm(x)), then x + MLP(Norm(x)); RoPE inside attention; logits in
float32. Every field of the model config is listed in `FIELDS`; `validate` checks them.
"""
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from freeatten_jax import attention, sharding
from freeatten_jax.attention_layer import Attention, KVCache, check_attention, default_init
from freeatten_jax.params import param

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
REMAT_POLICIES = {
    "none": jax.checkpoint_policies.everything_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "full": jax.checkpoint_policies.nothing_saveable,
}
ACTIVATIONS_BTE = ("act_batch", "act_length", "act_embed")


# ----------------------------------------------------------------------------- config


def _positive(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


# field -> (check, allowed values as shown in the error)
FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "attention": (lambda v: v in attention.VARIANTS, ", ".join(attention.VARIANTS)),
    "attention_options": (lambda v: hasattr(v, "items"), "a dict of the variant's options"),
    "implementation": (lambda v: v in attention.IMPLEMENTATIONS, ", ".join(attention.IMPLEMENTATIONS)),
    "vocab_size": (_positive, "a positive int"),
    "num_layers": (_positive, "a positive int"),
    "num_heads": (_positive, "a positive int"),
    "num_kv_heads": (lambda v: isinstance(v, int) and v >= 0, "0 (= num_heads) or a divisor of num_heads"),
    "d_model": (_positive, "a positive int divisible by num_heads into an even head_dim"),
    "mlp_dim": (_positive, "a positive int"),
    "mlp": (lambda v: v in MLPS, "gelu, swiglu"),
    "norm": (lambda v: v in NORMS, "layernorm, rmsnorm"),
    "tie_embeddings": (lambda v: isinstance(v, bool), "True, False"),
    "use_bias": (lambda v: isinstance(v, bool), "True, False"),
    "dropout": (lambda v: isinstance(v, (int, float)) and 0 <= v < 1, "a rate in [0, 1)"),
    "remat": (lambda v: v in REMAT_POLICIES, ", ".join(REMAT_POLICIES)),
    "dtype": (lambda v: v in DTYPES, ", ".join(DTYPES)),
    "param_dtype": (lambda v: v in DTYPES, ", ".join(DTYPES)),
    "rope_theta": (lambda v: isinstance(v, (int, float)) and v > 0, "a positive number"),
    "ssmax_s_init": (lambda v: isinstance(v, (int, float)) and (v > 0 or v == -1), "-1 (= 1/log(max_len)) or > 0"),
    "ssmax_bias": (lambda v: isinstance(v, bool), "True, False"),
    "max_len": (lambda v: _positive(v) and v > 1, "the training length, an int > 1"),
}


def validate(cfg_model: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming the first missing or invalid field and its allowed values."""
    for field, (ok, allowed) in FIELDS.items():
        if field not in cfg_model:
            raise ValueError(f"model.{field} is missing; allowed: {allowed}")
        if not ok(cfg_model[field]):
            raise ValueError(f"model.{field} = {cfg_model[field]!r} is invalid; allowed: {allowed}")
    if cfg_model.num_kv_heads and cfg_model.num_heads % cfg_model.num_kv_heads:
        raise ValueError(f"model.num_kv_heads = {cfg_model.num_kv_heads} must divide num_heads = {cfg_model.num_heads}")
    if cfg_model.d_model % cfg_model.num_heads or (cfg_model.d_model // cfg_model.num_heads) % 2:
        raise ValueError(f"model.d_model = {cfg_model.d_model} must split into num_heads even head dims")
    check_attention(cfg_model.attention, dict(cfg_model.attention_options))


def ssmax_s_init(cfg_model) -> float:
    """The configured initial SSMax s; -1 means 1/log(max_len): s log N_i starts at 1 at the training length."""
    return 1.0 / math.log(cfg_model.max_len) if cfg_model.ssmax_s_init == -1 else float(cfg_model.ssmax_s_init)


# ----------------------------------------------------------------------------- layers


class LayerNorm(nnx.Module):
    """(x - mean) / std * scale + bias, computed in float32."""

    def __init__(self, d_model: int, dtype, param_dtype, eps: float = 1e-5):
        self.scale_E = param(None, jax.nn.initializers.ones, (d_model,), ("embed",), param_dtype)
        self.bias_E = param(None, jax.nn.initializers.zeros, (d_model,), ("embed",), param_dtype)
        self.dtype, self.eps = dtype, eps

    def __call__(self, x_BTE):
        x_BTE = x_BTE.astype(jnp.float32)
        x_BTE = (x_BTE - x_BTE.mean(-1, keepdims=True)) * jax.lax.rsqrt(x_BTE.var(-1, keepdims=True) + self.eps)
        return (x_BTE * self.scale_E[...] + self.bias_E[...]).astype(self.dtype)


class RMSNorm(nnx.Module):
    """x / rms(x) * scale, computed in float32."""

    def __init__(self, d_model: int, dtype, param_dtype, eps: float = 1e-6):
        self.scale_E = param(None, jax.nn.initializers.ones, (d_model,), ("embed",), param_dtype)
        self.dtype, self.eps = dtype, eps

    def __call__(self, x_BTE):
        x_BTE = x_BTE.astype(jnp.float32)
        x_BTE = x_BTE * jax.lax.rsqrt(jnp.mean(x_BTE * x_BTE, -1, keepdims=True) + self.eps)
        return (x_BTE * self.scale_E[...]).astype(self.dtype)


NORMS = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}


class MlpKind(NamedTuple):
    activation: Callable[[jax.Array], jax.Array]
    gated: bool  # gated: activation(x W_in) * (x W_gate)


MLPS = {"gelu": MlpKind(jax.nn.gelu, gated=False), "swiglu": MlpKind(jax.nn.silu, gated=True)}


class Mlp(nnx.Module):
    """GELU MLP or gated SwiGLU, E -> F -> E."""

    def __init__(self, cfg, out_init, *, rngs: nnx.Rngs):
        e, f, pdtype = cfg.d_model, cfg.mlp_dim, DTYPES[cfg.param_dtype]
        self.kind, self.dtype = MLPS[cfg.mlp], DTYPES[cfg.dtype]
        self.w_in_EF = param(rngs.params(), default_init, (e, f), ("embed", "mlp"), pdtype)
        self.w_gate_EF = param(rngs.params(), default_init, (e, f), ("embed", "mlp"), pdtype) if self.kind.gated else None
        self.w_out_FE = param(rngs.params(), out_init, (f, e), ("mlp", "embed"), pdtype)
        zeros = jax.nn.initializers.zeros
        self.b_in_F = param(None, zeros, (f,), ("mlp",), pdtype) if cfg.use_bias else None
        self.b_out_E = param(None, zeros, (e,), ("embed",), pdtype) if cfg.use_bias else None

    def _dense(self, x, w, b, spec):
        y = jnp.einsum(spec, x, w[...].astype(self.dtype))
        return y if b is None else y + b[...].astype(self.dtype)

    def __call__(self, x_BTE):
        h_BTF = self.kind.activation(self._dense(x_BTE, self.w_in_EF, self.b_in_F, "BTE,EF->BTF"))
        if self.kind.gated:
            h_BTF = h_BTF * self._dense(x_BTE, self.w_gate_EF, None, "BTE,EF->BTF")
        return self._dense(h_BTF, self.w_out_FE, self.b_out_E, "BTF,FE->BTE")


class Block(nnx.Module):
    """Pre-norm residual block: attention, then MLP; dropout on each branch."""

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        dtype, pdtype = DTYPES[cfg.dtype], DTYPES[cfg.param_dtype]
        out_init = jax.nn.initializers.normal(0.02 / math.sqrt(2 * cfg.num_layers))  # GPT-2 residual scaling
        self.attn_norm = NORMS[cfg.norm](cfg.d_model, dtype, pdtype)
        self.attn = Attention(
            cfg.d_model, cfg.num_heads, rngs=rngs, num_kv_heads=cfg.num_kv_heads or None,
            variant=cfg.attention, options=dict(cfg.attention_options), implementation=cfg.implementation,
            use_bias=cfg.use_bias, rope_theta=cfg.rope_theta, ssmax_s_init=ssmax_s_init(cfg),
            ssmax_bias=cfg.ssmax_bias, dtype=dtype, param_dtype=pdtype, out_init=out_init,
        )
        self.mlp_norm = NORMS[cfg.norm](cfg.d_model, dtype, pdtype)
        self.mlp = Mlp(cfg, out_init, rngs=rngs)
        self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)

    def __call__(self, x_BTE, positions_BT, segment_ids_BT):
        h_BTE = self.attn(self.attn_norm(x_BTE), positions_BT=positions_BT, segment_ids_BT=segment_ids_BT)
        x_BTE = x_BTE + self.dropout(h_BTE)
        x_BTE = x_BTE + self.dropout(self.mlp(self.mlp_norm(x_BTE)))
        return sharding.constrain(x_BTE, ACTIVATIONS_BTE)

    def decode(self, x_BTE, cache: KVCache, positions_BT, segment_ids_BT):
        h_BTE, cache = self.attn.decode(
            self.attn_norm(x_BTE), cache, positions_BT=positions_BT, segment_ids_BT=segment_ids_BT
        )
        x_BTE = x_BTE + self.dropout(h_BTE)
        return x_BTE + self.dropout(self.mlp(self.mlp_norm(x_BTE))), cache


def _run_block(block: Block, x_BTE, positions_BT, segment_ids_BT):
    return block(x_BTE, positions_BT, segment_ids_BT)


# ----------------------------------------------------------------------------- model


class Transformer(nnx.Module):
    """Decoder-only LM. `model(tokens_BT)` gives float32 logits_BTV; model.train()/eval() toggle dropout.

    rngs: the 'params' stream (else 'default') initialises, 'dropout' (else 'default') drives dropout.
    Differentiate with NNX transforms (nnx.value_and_grad; merge with copy=True inside jax transforms):
    the lifted remat and the dropout streams are NNX state, which plain jax.grad cannot update.
    """

    def __init__(self, cfg_model: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
        validate(cfg_model)
        cfg = cfg_model
        v, e, pdtype = cfg.vocab_size, cfg.d_model, DTYPES[cfg.param_dtype]
        self.dtype = DTYPES[cfg.dtype]
        self.remat_policy = REMAT_POLICIES[cfg.remat]
        self.embed_VE = param(rngs.params(), default_init, (v, e), ("vocab", "embed"), pdtype)
        self.embed_dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.final_norm = NORMS[cfg.norm](e, self.dtype, pdtype)
        tied = cfg.tie_embeddings
        self.unembed_EV = None if tied else param(rngs.params(), default_init, (e, v), ("embed", "vocab"), pdtype)

    def __call__(self, tokens_BT, *, positions_BT=None, segment_ids_BT=None) -> jax.Array:
        """Logits [B, T, V] float32; positions default to 0..T-1 (pass per-document ones when packed)."""
        x_BTE = self._embed(tokens_BT)
        run = nnx.remat(_run_block, policy=self.remat_policy)
        for block in self.blocks:
            x_BTE = run(block, x_BTE, positions_BT, segment_ids_BT)
        return self._logits(x_BTE)

    def init_cache(self, batch: int, max_len: int) -> tuple[KVCache, ...]:
        """An empty KV cache of max_len slots per layer."""
        return tuple(block.attn.init_cache(batch, max_len) for block in self.blocks)

    def decode(self, tokens_BT, cache, *, positions_BT=None, segment_ids_BT=None):
        """(logits [B, T, V], cache) for T new tokens appended to the cache (prefill or one step).

        Positions default to the cache length onwards, so N_i follows the absolute position.
        """
        x_BTE = self._embed(tokens_BT)
        new_cache = []
        for block, layer_cache in zip(self.blocks, cache):
            x_BTE, layer_cache = block.decode(x_BTE, layer_cache, positions_BT, segment_ids_BT)
            new_cache.append(layer_cache)
        return self._logits(x_BTE), tuple(new_cache)

    def set_attention(self, variant: str | None = None, **options) -> None:
        """Eval-time switch in every layer, no parameter changes: e.g. ('lssar', p=15) on an LSSA model.

        The variant defaults to the current one; options replace the current ones.
        """
        for block in self.blocks:
            block.attn.set_attention(variant, **options)

    def set_implementation(self, implementation: str, **options) -> None:
        """How every layer computes attention, e.g. ('blockwise', block_q=256, block_k=256)."""
        for block in self.blocks:
            block.attn.set_implementation(implementation, **options)

    def set_rope_theta(self, theta: float) -> None:
        """Eval-time RoPE base override (e.g. 50x the training theta, as in the SSMax paper)."""
        for block in self.blocks:
            block.attn.rope_theta = float(theta)

    def _embed(self, tokens_BT):
        x_BTE = jnp.take(self.embed_VE[...], tokens_BT, axis=0).astype(self.dtype)
        return sharding.constrain(self.embed_dropout(x_BTE), ACTIVATIONS_BTE)

    def _logits(self, x_BTE):
        x_BTE = self.final_norm(x_BTE)
        if self.unembed_EV is None:
            w_EV = self.embed_VE[...].astype(self.dtype).T
        else:
            w_EV = self.unembed_EV[...].astype(self.dtype)
        logits_BTV = jnp.einsum("BTE,EV->BTV", x_BTE, w_EV, preferred_element_type=jnp.float32)
        return sharding.constrain(logits_BTV, ("act_batch", "act_length", "act_vocab"))
