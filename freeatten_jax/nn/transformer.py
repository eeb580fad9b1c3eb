"""A decoder-only transformer in Flax NNX with pluggable attention (any `attention.VARIANTS`).

Glossary: B batch, T positions, S cache slots, E d_model, F mlp_dim, V vocabulary.
Pre-norm blocks: x + Attention(Norm(x)), then x + MLP(Norm(x)); RoPE inside attention; logits in
float32. Built from a `ModelConfig` (freeatten_jax.nn.config), which checks every field.
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from freeatten_jax.nn import sharding, together
from freeatten_jax.nn.attention_layer import Attention, KVCache, default_init
from freeatten_jax.nn.config import ModelConfig
from freeatten_jax.nn.params import param
from freeatten_jax.nn.rope import Scaling

REMAT_POLICIES = {  # "none": blocks are not wrapped in a remat at all
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "full": jax.checkpoint_policies.nothing_saveable,
}
ACTIVATIONS_BTE = ("act_batch", "act_length", "act_embed")


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


def make_norm(cfg: ModelConfig):
    """The configured norm over d_model, with cfg.norm_eps if set (else the norm's own epsilon)."""
    eps = {} if cfg.norm_eps is None else {"eps": cfg.norm_eps}
    return NORMS[cfg.norm](cfg.d_model, cfg.dtype, cfg.param_dtype, **eps)


class MlpKind(NamedTuple):
    activation: Callable[[jax.Array], jax.Array]
    gated: bool  # gated: activation(x W_in) * (x W_gate)


MLPS = {"gelu": MlpKind(jax.nn.gelu, gated=False), "swiglu": MlpKind(jax.nn.silu, gated=True)}


class Mlp(nnx.Module):
    """GELU MLP or gated SwiGLU, E -> F -> E."""

    def __init__(self, cfg: ModelConfig, out_init, *, rngs: nnx.Rngs):
        e, f, pdtype = cfg.d_model, cfg.mlp_dim, cfg.param_dtype
        self.kind, self.dtype = MLPS[cfg.mlp], cfg.dtype
        self.w_in_EF = param(rngs.params(), default_init, (e, f), ("embed", "mlp"), pdtype)
        self.w_gate_EF = param(rngs.params(), default_init, (e, f), ("embed", "mlp"), pdtype) if self.kind.gated else None
        self.w_out_FE = param(rngs.params(), out_init, (f, e), ("mlp", "embed"), pdtype)
        zeros = jax.nn.initializers.zeros
        self.b_in_F = param(None, zeros, (f,), ("mlp",), pdtype) if cfg.use_bias else None
        self.b_out_E = param(None, zeros, (e,), ("embed",), pdtype) if cfg.use_bias else None

    def _dense(self, x, w, b, spec):
        y = together.dense(spec, x, w[...].astype(self.dtype))
        return y if b is None else y + b[...].astype(self.dtype)

    def __call__(self, x_BTE):
        h_BTF = self.kind.activation(self._dense(x_BTE, self.w_in_EF, self.b_in_F, "BTE,EF->BTF"))
        if self.kind.gated:
            h_BTF = h_BTF * self._dense(x_BTE, self.w_gate_EF, None, "BTE,EF->BTF")
        return self._dense(h_BTF, self.w_out_FE, self.b_out_E, "BTF,FE->BTE")


class Block(nnx.Module):
    """Pre-norm residual block: attention, then MLP; dropout on each branch."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        dtype, pdtype = cfg.dtype, cfg.param_dtype
        out_init = jax.nn.initializers.normal(0.02 / math.sqrt(2 * cfg.num_layers))  # GPT-2 residual scaling
        self.attn_norm = make_norm(cfg)
        self.attn = Attention(
            cfg.d_model,
            cfg.num_heads,
            rngs=rngs,
            num_kv_heads=cfg.num_kv_heads or None,
            variant=cfg.attention,
            options=dict(cfg.attention_options),
            implementation=cfg.implementation,
            use_bias=cfg.use_bias,
            qkv_bias=cfg.qkv_bias,
            window=cfg.window,
            rope_theta=cfg.rope_theta,
            rope_scaling=cfg.rope_frequency_scaling,
            ssmax_s_init=cfg.initial_ssmax_s,
            ssmax_bias=cfg.ssmax_bias,
            ssmax_learn_s=cfg.ssmax_learn_s,
            dtype=dtype,
            param_dtype=pdtype,
            out_init=out_init,
        )
        self.mlp_norm = make_norm(cfg)
        self.mlp = Mlp(cfg, out_init, rngs=rngs)
        self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)

    def __call__(self, x_BTE, positions_BT, segment_ids_BT, cache: KVCache | None = None):
        """(x_BTE, cache): the cache (None without one) as the attention layer returned it."""
        h_BTE = self.attn(self.attn_norm(x_BTE), positions_BT=positions_BT, segment_ids_BT=segment_ids_BT, cache=cache)
        h_BTE, cache = (h_BTE, None) if cache is None else h_BTE
        x_BTE = x_BTE + self.dropout(h_BTE)
        x_BTE = x_BTE + self.dropout(self.mlp(self.mlp_norm(x_BTE)))
        return sharding.constrain(x_BTE, ACTIVATIONS_BTE), cache


# ----------------------------------------------------------------------------- model


def unembed(x_BTE, w_EV):
    """float32 logits [B, T, V] = x_BTE w_EV, sharded as the logits' logical axes say."""
    logits_BTV = jnp.einsum("BTE,EV->BTV", x_BTE, w_EV, preferred_element_type=jnp.float32)
    return sharding.constrain(logits_BTV, ("act_batch", "act_length", "act_vocab"))


def _gradients_together(block: Block, x_BTE, positions_BT, segment_ids_BT, cache):
    """The block, its parameters' gradients handed out with its input's (nn.together.block); inside a remat, where the
    block is the remat's own copy and may be updated."""
    return block(together.block(block, x_BTE), positions_BT, segment_ids_BT, cache)


class Transformer(nnx.Module):
    """Decoder-only LM. `model(tokens_BT)` gives float32 logits_BTV; model.train()/eval() toggle dropout.

    rngs: the 'params' stream (else 'default') initialises, 'dropout' (else 'default') drives dropout.
    Differentiate with NNX transforms (nnx.value_and_grad; merge with copy=True inside jax transforms):
    the lifted remat and the dropout streams are NNX state, which plain jax.grad cannot update.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        v, e, pdtype = cfg.vocab_size, cfg.d_model, cfg.param_dtype
        self.dtype = cfg.dtype
        self.remat = cfg.remat
        self.embed_VE = param(rngs.params(), default_init, (v, e), ("vocab", "embed"), pdtype)
        self.embed_dropout = nnx.Dropout(cfg.dropout, rngs=rngs)
        self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.final_norm = make_norm(cfg)
        tied = cfg.tie_embeddings
        self.unembed_EV = None if tied else param(rngs.params(), default_init, (e, v), ("embed", "vocab"), pdtype)

    def __call__(self, tokens_BT, *, positions_BT=None, segment_ids_BT=None, cache: tuple[KVCache, ...] | None = None):
        """Logits [B, T, V] float32, or `(logits, cache)` when a cache (`init_cache`) is given.

        Without a cache, positions default to 0..T-1 (pass per-document ones when packed). With one, the T
        tokens are appended to it (a prefill or one decoding step): positions continue each row's last cached
        position and segment, so N_i follows the absolute position. Both go through the same blocks, remat
        and sharding constraints.
        """
        x_BTE, layer_caches = self._blocks(tokens_BT, positions_BT, segment_ids_BT, cache)
        logits_BTV = self.logits(x_BTE)
        return logits_BTV if cache is None else (logits_BTV, layer_caches)

    def features(self, tokens_BT, *, positions_BT=None, segment_ids_BT=None, cache: tuple[KVCache, ...] | None = None):
        """The final-normed features x_BTE that `logits` turns into logits (for a loss that never holds all of
        them at once, training.loss; a prefill that needs the last position's alone), or `(x_BTE, cache)` when a
        cache is given, as `__call__`."""
        x_BTE, layer_caches = self._blocks(tokens_BT, positions_BT, segment_ids_BT, cache)
        return x_BTE if cache is None else (x_BTE, layer_caches)

    def unembedding(self):
        """w_EV: features -> logits (the embedding's transpose when tied), in the compute dtype."""
        return (self.embed_VE[...].T if self.unembed_EV is None else self.unembed_EV[...]).astype(self.dtype)

    def logits(self, x_BTE):
        """float32 logits [B, T, V] of final-normed features."""
        return unembed(x_BTE, self.unembedding())

    def init_cache(self, batch: int, max_len: int) -> tuple[KVCache, ...]:
        """An empty KV cache of max_len slots per layer."""
        return tuple(block.attn.init_cache(batch, max_len) for block in self.blocks)

    def set_attention(self, variant: str | None = None, **options) -> None:
        """Eval-time switch in every layer, no parameter changes: e.g. ('lssar', p=15) on an LSSA model.

        The variant defaults to the current one; options replace the current ones.
        """
        for layer in self.attention_layers:
            layer.set_attention(variant, **options)

    def set_implementation(self, implementation: str, **options) -> None:
        """How every layer computes attention, e.g. ('blockwise', block_q=256, block_k=256)."""
        for layer in self.attention_layers:
            layer.set_implementation(implementation, **options)

    def set_rope_theta(self, theta: float) -> None:
        """Eval-time RoPE base override (e.g. 50x the training theta, as in the SSMax paper)."""
        for layer in self.attention_layers:
            layer.set_rope_theta(theta)

    def set_rope_scaling(self, scaling: Scaling) -> None:
        """Eval-time RoPE frequency scaling in every layer (rope.Scaling: e.g. linear by 4), the base kept."""
        for layer in self.attention_layers:
            layer.set_rope_scaling(scaling)

    def set_ssmax_s(self, s: float) -> None:
        """Eval-time override of the learned SSMax s in every layer and head (ssmax models only)."""
        for layer in self.attention_layers:
            layer.set_ssmax_s(s)

    @property
    def attention_layers(self) -> tuple[Attention, ...]:
        """Every layer's attention (variant, options and learned s via `variant_options()`)."""
        return tuple(block.attn for block in self.blocks)

    def attention_qk(self, tokens_BT, *, positions_BT=None, segment_ids_BT=None):
        """(logits, ((q_BTHD, k_BTKD) per layer)): the rotated queries and keys of the real forward pass."""
        for layer in self.attention_layers:
            layer.capture = True
        try:
            logits_BTV = self(tokens_BT, positions_BT=positions_BT, segment_ids_BT=segment_ids_BT)
        finally:
            for layer in self.attention_layers:
                layer.capture = False
        captured = nnx.pop(self, nnx.Intermediate)
        return logits_BTV, tuple(captured["blocks"][i]["attn"]["qk"].get_value()[0] for i in range(len(self.blocks)))

    def _embed(self, tokens_BT):
        x_BTE = jnp.take(self.embed_VE[...], tokens_BT, axis=0).astype(self.dtype)
        return sharding.constrain(self.embed_dropout(x_BTE), ACTIVATIONS_BTE)

    def _blocks(self, tokens_BT, positions_BT, segment_ids_BT, cache):
        """The blocks' output after the final norm, and the updated caches (None entries without a cache)."""
        x_BTE = self._embed(tokens_BT)
        run = Block.__call__ if self.remat == "none" else nnx.remat(_gradients_together, policy=REMAT_POLICIES[self.remat])
        layer_caches = [None] * len(self.blocks) if cache is None else list(cache)
        for i, block in enumerate(self.blocks):
            x_BTE, layer_caches[i] = run(block, x_BTE, positions_BT, segment_ids_BT, layer_caches[i])
        return self.final_norm(x_BTE), tuple(layer_caches)
