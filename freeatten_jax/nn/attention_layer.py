"""`Attention`: a Flax NNX layer around `attention.attend` (any variant, GQA, RoPE, KV cache).

Glossary: B batch, T new positions, S cache slots, E model width, H query heads,
K key/value heads, D head dim.

The variant, its options, the implementation and the RoPE theta and scaling are plain attributes: switching
them at eval time (`set_attention`, `set_rope_theta`, `set_rope_scaling`) changes no parameter. Only `ssmax` owns
parameters beyond the projections: a learnable per-head `s` (and optionally `b`, see `set_ssmax_s`).
With `capture = True` the layer sows its rotated q and k (`nnx.Intermediate` "qk") for analysis.
"""

import dataclasses
import functools
import typing
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec

from freeatten_jax import attention
from freeatten_jax.attention.variants import is_concrete
from freeatten_jax.nn import sharding, together
from freeatten_jax.nn.config import check_attention
from freeatten_jax.nn.params import Init, param
from freeatten_jax.nn.rope import NO_SCALING, Scaling, apply_rope

default_init = jax.nn.initializers.normal(0.02)
CACHE_BSKD, CACHE_BS = ("act_batch", "cache_length", "kv_heads", None), ("act_batch", "cache_length")  # a KV cache's axes
CACHE_NAMES = (CACHE_BSKD, CACHE_BSKD, CACHE_BS, CACHE_BS)  # of k, v, positions, segment ids


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["k_BSKD", "v_BSKD", "positions_BS", "segment_ids_BS", "length"],
    meta_fields=[],
)
@dataclasses.dataclass(frozen=True)
class KVCache:
    """One layer's cache: rotated keys and values in S slots, their absolute positions and
    segment ids, and `length`, the number of filled slots (slots at and after it are masked)."""

    k_BSKD: jax.Array
    v_BSKD: jax.Array
    positions_BS: jax.Array  # int32
    segment_ids_BS: jax.Array  # int32
    length: jax.Array  # int32 scalar

    @classmethod
    def empty(cls, batch: int, max_len: int, num_kv_heads: int, head_dim: int, dtype) -> "KVCache":
        kv = lambda: jnp.zeros((batch, max_len, num_kv_heads, head_dim), dtype)
        ids = lambda: jnp.zeros((batch, max_len), jnp.int32)
        return cls(kv(), kv(), ids(), ids(), jnp.zeros((), jnp.int32))  # distinct buffers: donatable

    def append(self, k_BTKD, v_BTKD, positions_BT, segment_ids_BT) -> "KVCache":
        """Writes T new entries at slot `length`; ValueError where they cannot fit (length known, or T > S): a
        dynamic_update_slice would silently shift them onto the last slots."""
        at, t, slots = self.length, k_BTKD.shape[1], self.k_BSKD.shape[1]
        free = slots - (int(at) if is_concrete(at) else 0)
        if t > free:
            raise ValueError(
                f"{t} new tokens do not fit the KV cache: {free} of its {slots} slots are free (init_cache: a larger max_len)"
            )
        k_BSKD, v_BSKD, positions_BS, segment_ids_BS = self._written((k_BTKD, v_BTKD, positions_BT, segment_ids_BT))
        return KVCache(k_BSKD, v_BSKD, positions_BS, segment_ids_BS, at + t)

    def _written(self, entries) -> tuple:
        """k, v, positions and segment ids with `entries` (theirs for T new tokens) written from slot `length`. Where
        'cache_length' splits the slots (sharding.cache_axis), each device writes the entries that fall in its own:
        XLA's partitioner updates a slice of several slots of a split array by gathering the whole array."""
        arrays, at, axis = dataclasses.astuple(self)[:4], self.length, sharding.cache_axis()
        specs = tuple(typing.cast(PartitionSpec, sharding.active_spec(n, x.shape)) for n, x in zip(CACHE_NAMES, arrays))
        if axis is None or specs[0][1] != axis:  # not split (a cache made outside the mesh may not divide over it)
            return tuple(
                jax.lax.dynamic_update_slice(x, y.astype(x.dtype), (0, at) + (0,) * (x.ndim - 2)) for x, y in zip(arrays, entries)
            )

        def local(arrays, entries, at):
            slots = arrays[0].shape[1]
            index_T = at + jnp.arange(entries[0].shape[1]) - jax.lax.axis_index(axis) * slots
            index_T = jnp.where((index_T >= 0) & (index_T < slots), index_T, slots)  # another device's slot: dropped
            return tuple(x.at[:, index_T].set(y.astype(x.dtype), mode="drop") for x, y in zip(arrays, entries))

        whole = tuple(PartitionSpec(spec[0], None, *spec[2:]) for spec in specs)  # the new entries on every device
        return jax.shard_map(local, in_specs=(specs, whole, PartitionSpec()), out_specs=specs, check_vma=False)(
            arrays, entries, at
        )

    def next_positions(self, batch: int, t: int, positions_BT=None, segment_ids_BT=None) -> tuple[jax.Array, jax.Array]:
        """Positions and segment ids [B, T] of T new entries: the given ones, else each row's last cached
        position + 1 onwards (0.. when empty) and its last cached segment."""
        last, filled = jnp.maximum(self.length - 1, 0), self.length > 0
        next_B1 = jnp.where(filled, self.positions_BS[:, last] + 1, 0)[:, None]
        positions_BT = jnp.broadcast_to(next_B1 + jnp.arange(t) if positions_BT is None else positions_BT, (batch, t))
        segment_B1 = jnp.where(filled, self.segment_ids_BS[:, last], 0)[:, None]
        return positions_BT, jnp.broadcast_to(segment_B1 if segment_ids_BT is None else segment_ids_BT, (batch, t))

    def laid_out(self) -> "KVCache":
        """The cache with its slots over the mesh axis of the rule 'cache_length' (under sharding.use_mesh)."""
        return KVCache(*(sharding.constrain(x, n) for x, n in zip(dataclasses.astuple(self), (*CACHE_NAMES, ()))))

    def filled_BS(self) -> jax.Array:
        """True for slots holding a real key."""
        slots_S = jnp.arange(self.k_BSKD.shape[1])
        return jnp.broadcast_to(slots_S < self.length, self.positions_BS.shape)


class Attention(nnx.Module):
    """Causal self-attention: projections, RoPE, then `attention.attend` with the chosen variant.

    ssmax_s_init: the initial per-head `s` of SSMax. The paper gives none; 1.0 applies the
    length factor log N_i at full strength from the first step. `Transformer` passes
    1 / log(training length) by default so that SSMax starts out as softmax at that length.
    ssmax_learn_s=False keeps s at that value (no gradient reaches it): the fixed log-length temperature control.
    Parameters are annotated with logical axes ('embed', 'heads', 'kv_heads', 'head_dim') but
    never sharded eagerly, so the layer builds with or without a mesh.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        rngs: nnx.Rngs,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        variant: str = "softmax",
        options: dict[str, Any] | None = None,
        implementation: str = "auto",
        implementation_options: dict[str, Any] | None = None,
        use_bias: bool = False,
        qkv_bias: bool = False,
        window: int | None = None,
        rope_theta: float = 10_000.0,
        rope_scaling: Scaling = NO_SCALING,
        ssmax_s_init: float = 1.0,
        ssmax_bias: bool = False,
        ssmax_learn_s: bool = True,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        kernel_init: Init = default_init,
        out_init: Init = default_init,
    ):
        num_kv_heads = num_kv_heads or num_heads
        head_dim = head_dim or d_model // num_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}")
        e, h, k, d = d_model, num_heads, num_kv_heads, head_dim
        self.num_kv_heads, self.head_dim = k, d
        self.dtype, self.rope_theta, self.rope_scaling = dtype, float(rope_theta), rope_scaling
        self.implementation, self.implementation_options = implementation, tuple[tuple[str, Any], ...]()
        self.set_implementation(implementation, **(implementation_options or {}))
        self.wq_EHD = param(rngs.params(), kernel_init, (e, h, d), ("embed", "heads", "head_dim"), param_dtype)
        self.wk_EKD = param(rngs.params(), kernel_init, (e, k, d), ("embed", "kv_heads", "head_dim"), param_dtype)
        self.wv_EKD = param(rngs.params(), kernel_init, (e, k, d), ("embed", "kv_heads", "head_dim"), param_dtype)
        self.wo_HDE = param(rngs.params(), out_init, (h, d, e), ("heads", "head_dim", "embed"), param_dtype)
        zeros = jax.nn.initializers.zeros
        self.biases = nnx.data(None)
        if use_bias or qkv_bias:  # qkv_bias: none on the output projection (Qwen2's)
            out = dict(o_E=param(None, zeros, (e,), ("embed",), param_dtype)) if use_bias else {}
            self.biases = nnx.Dict(
                q_HD=param(None, zeros, (h, d), ("heads", "head_dim"), param_dtype),
                k_KD=param(None, zeros, (k, d), ("kv_heads", "head_dim"), param_dtype),
                v_KD=param(None, zeros, (k, d), ("kv_heads", "head_dim"), param_dtype),
                **out,
            )
        self.window = window  # attend's window: keys fewer than `window` positions from the query
        self.s_H = self.b_H = nnx.data(None)
        self.ssmax_learn_s = ssmax_learn_s
        if variant == "ssmax":
            self.s_H = param(None, jax.nn.initializers.constant(ssmax_s_init), (h,), ("heads",), param_dtype)
            if ssmax_bias:
                self.b_H = param(None, zeros, (h,), ("heads",), param_dtype)
        self.variant, self.options = "softmax", tuple[tuple[str, Any], ...]()
        self.set_attention(variant, **(options or {}))
        self.capture = False  # sow (q_BTHD, k_BTKD) on every call, for attention analysis

    def set_rope_theta(self, theta: float) -> None:
        """Eval-time RoPE base (e.g. 50x the training theta, as in the SSMax paper)."""
        self.rope_theta = float(theta)

    def set_rope_scaling(self, scaling: Scaling) -> None:
        """Eval-time RoPE frequency scaling (e.g. linear by 4: positions read as a quarter of their value)."""
        self.rope_scaling = scaling

    def set_ssmax_s(self, s: float) -> None:
        """Overrides the learned SSMax s of every head (an eval-time switch)."""
        if self.s_H is None:
            raise ValueError(f"set_ssmax_s needs an ssmax layer, this one is {self.variant!r}")
        self.s_H[...] = jnp.full_like(self.s_H[...], s)

    def set_attention(self, variant: str | None = None, **options) -> None:
        """Switches the variant (default: keep it) and replaces its options, e.g. ('lssar', p=15)."""
        variant = variant or self.variant
        check_attention(variant, options)
        if variant == "ssmax" and self.s_H is None:
            raise ValueError("variant 'ssmax' needs the learnable s: build the layer with variant='ssmax'")
        self.variant, self.options = variant, tuple(sorted(options.items()))

    def set_implementation(self, implementation: str, **options) -> None:
        """How attention is computed (attention.IMPLEMENTATIONS), with its options, e.g. block sizes."""
        if implementation not in attention.IMPLEMENTATIONS:
            raise ValueError(f"unknown implementation {implementation!r}; valid: {', '.join(attention.IMPLEMENTATIONS)}")
        self.implementation, self.implementation_options = implementation, tuple(sorted(options.items()))

    def init_cache(self, batch: int, max_len: int) -> KVCache:
        """An empty cache of max_len slots in the compute dtype; where the rule 'cache_length' shards the slots over
        n devices (under sharding.use_mesh), max_len rounded up to a multiple of 2n and the slots laid out over them."""
        chunks = sharding.cache_chunks()
        cache = KVCache.empty(batch, -(-max_len // chunks) * chunks, self.num_kv_heads, self.head_dim, self.dtype)
        return cache if chunks == 1 else cache.laid_out()

    def __call__(self, x_BTE, *, positions_BT=None, segment_ids_BT=None, cache: KVCache | None = None):
        """Self-attention over x: `y_BTE`, or `(y_BTE, cache)` when a cache is given.

        Without a cache, x attends to itself: positions default to 0..T-1 and segment ids mask packed
        documents. With a cache, x's T new positions are appended to it and attend over every filled slot;
        positions default to each row's last cached position + 1 onwards (0.. on an empty cache) and
        segment ids to its last cached segment, so N_i is the query's absolute position + 1 (restarting per
        segment, as in packed training). Either way the call goes through the same projections, RoPE and
        `_attend` (context-parallel where the mesh shards the sequence, or a cache's slots).
        """
        b, t = x_BTE.shape[:2]
        if cache is None:
            mask: dict[
                str, Any
            ] = {}  # only what the caller gave, so a plain mask stays visibly plain (fused kernels, Mask.plain)
            if self.window is not None:
                mask.update(window=self.window)
            if positions_BT is not None:
                mask.update(q_positions=positions_BT, kv_positions=positions_BT)
            if segment_ids_BT is not None:
                mask.update(q_segment_ids=segment_ids_BT, kv_segment_ids=segment_ids_BT)
            positions_BT = jnp.broadcast_to(jnp.arange(t) if positions_BT is None else positions_BT, (b, t))
        else:
            positions_BT, segment_ids_BT = cache.next_positions(b, t, positions_BT, segment_ids_BT)
        q_BTHD, k_BTKD, v_BTKD = self._qkv(x_BTE, positions_BT)
        if self.capture:
            self.sow(nnx.Intermediate, "qk", (q_BTHD, k_BTKD))
        if cache is None:
            return self._project_out(self._attend(q_BTHD, k_BTKD, v_BTKD, "act_length", **mask))
        cache = cache.append(k_BTKD, v_BTKD, positions_BT, segment_ids_BT)
        out_BTHD = self._attend(
            q_BTHD,
            cache.k_BSKD,
            cache.v_BSKD,
            "cache_length",
            q_positions=positions_BT,
            kv_positions=cache.positions_BS,
            q_segment_ids=segment_ids_BT,
            kv_segment_ids=cache.segment_ids_BS,
            kv_mask=cache.filled_BS(),
            window=self.window,
        )
        return self._project_out(out_BTHD), cache

    def _qkv(self, x_BTE, positions_BT):
        """Projected, biased and rotated q, k, v in the compute dtype."""
        x_BTE = x_BTE.astype(self.dtype)
        project = lambda w: together.dense("BTE,END->BTND", x_BTE, w[...].astype(self.dtype))
        q_BTHD, k_BTKD, v_BTKD = project(self.wq_EHD), project(self.wk_EKD), project(self.wv_EKD)
        if self.biases is not None:
            q_BTHD += self.biases["q_HD"][...].astype(self.dtype)
            k_BTKD += self.biases["k_KD"][...].astype(self.dtype)
            v_BTKD += self.biases["v_KD"][...].astype(self.dtype)
        rotate = lambda x_BTND: apply_rope(x_BTND, positions_BT, self.rope_theta, self.rope_scaling)
        return rotate(q_BTHD), rotate(k_BTKD), v_BTKD

    def variant_options(self) -> dict[str, Any]:
        """The variant's options as `attention.attend` takes them, the learned SSMax s (and b) included."""
        learned = {}
        if self.variant == "ssmax" and self.s_H is not None:  # set_attention refuses ssmax without s
            learned["s"] = self.s_H[...] if self.ssmax_learn_s else jax.lax.stop_gradient(self.s_H[...])
            if self.b_H is not None:
                learned["b"] = self.b_H[...]
        return {**dict(self.options), **learned}

    def _attend(self, q_BTHD, k_BSKD, v_BSKD, length_axis: str, **mask):
        """`attention.attend`, or where the active mesh shards the keys' sequence (`sharding.context_parallelism` of
        `length_axis`: 'act_length' for self-attention, 'cache_length' for a KV cache) `context_parallel_attend` (a
        ring: the kernels on each device, or the blockwise rules, as the implementation says); new tokens that do not
        split into the ring's 2n chunks (a decoding step) attend to a cache by `sharded_decode_attend` (each device to
        its own slots, the row statistics merged across the axis)."""
        options = dict(variant=self.variant, **self.variant_options(), **mask)
        how = dict(self.implementation_options, implementation=self.implementation)
        (b, t, h), (s, kv_heads) = q_BTHD.shape[:3], k_BSKD.shape[1:3]
        context = sharding.context_parallelism((b, s, h), kv_heads, length_axis)
        if context is None:
            return attention.attend(q_BTHD, k_BSKD, v_BSKD, **how, **options)
        if length_axis == "cache_length" and t % sharding.cache_chunks():
            return attention.sharded_decode_attend(q_BTHD, k_BSKD, v_BSKD, **context, block_k=how.get("block_k"), **options)
        return attention.context_parallel_attend(q_BTHD, k_BSKD, v_BSKD, **context, **how, **options)

    def _project_out(self, out_BTHD):
        y_BTE = together.dense("BTHD,HDE->BTE", out_BTHD, self.wo_HDE[...].astype(self.dtype))
        return y_BTE if self.biases is None or "o_E" not in self.biases else y_BTE + self.biases["o_E"][...].astype(self.dtype)
