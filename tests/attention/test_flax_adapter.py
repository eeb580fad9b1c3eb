"""flax_attention_fn inside Flax's own attention modules (nnx and linen), KV-cache decoding included.

Glossary: B batch, T length, E features, H heads. Flax's reference attention gives the mean of the
values on a row that sees nothing where ours gives zeros (docs/method.md §8), so rows without any visible key
are left out of the comparisons with Flax.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen, nnx

from freeatten_jax import attention

B, T, E, H = 2, 10, 16, 4
X_BTE = jax.random.normal(jax.random.key(0), (B, T, E))
VALID_BT = jnp.arange(T)[None] < jnp.array([[7], [10]])


def _masks():
    """Flax-style masks [B, 1 or H, T, T] (float 0/1 as Flax makes them, and bool)."""
    causal = nnx.make_causal_mask(jnp.ones((B, T)))
    random = jax.random.bernoulli(jax.random.key(1), 0.5, (B, H, T, T)) | jnp.eye(T, dtype=bool)
    return {
        "causal": causal,
        "causal_padding": nnx.combine_masks(causal, nnx.make_attention_mask(VALID_BT, VALID_BT)),
        "bidirectional_padding": nnx.make_attention_mask(VALID_BT, VALID_BT),
        "random_per_head": random,
    }


def _rows_seeing_something(mask):
    return np.asarray(jnp.all(jnp.any(jnp.broadcast_to(mask, (B, H, T, T)) > 0, axis=-1), axis=1))


def _nnx_pair(variant="softmax", **options):
    """Two nnx.MultiHeadAttention with identical parameters: Flax's attention and the adapter."""
    make = functools.partial(nnx.MultiHeadAttention, num_heads=H, in_features=E, decode=False)
    return make(rngs=nnx.Rngs(0)), make(attention_fn=attention.flax_attention_fn(variant, **options), rngs=nnx.Rngs(0))


@pytest.mark.parametrize("mask_name", list(_masks()))
def test_nnx_softmax_equals_flax(mask_name):
    mask = _masks()[mask_name]
    flax_mha, ours = _nnx_pair()
    rows = _rows_seeing_something(mask)
    np.testing.assert_allclose(ours(X_BTE, mask=mask)[rows], flax_mha(X_BTE, mask=mask)[rows], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask_name", list(_masks()))
def test_linen_softmax_equals_flax(mask_name):
    """linen filters attention_fn's keywords by signature: the mask must still arrive."""
    mask = _masks()[mask_name]
    flax_mha = linen.MultiHeadDotProductAttention(num_heads=H, qkv_features=E)
    ours = linen.MultiHeadDotProductAttention(num_heads=H, qkv_features=E, attention_fn=attention.flax_attention_fn("softmax"))
    params = flax_mha.init(jax.random.key(2), X_BTE, mask=mask)
    rows = _rows_seeing_something(mask)
    np.testing.assert_allclose(
        ours.apply(params, X_BTE, mask=mask)[rows], flax_mha.apply(params, X_BTE, mask=mask)[rows], rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("variant", ["softmax", "lssar"])
def test_nnx_kv_cache_decoding_equals_full_forward(variant):
    """Flax's own cache (init_cache, decode=True, one token at a time) equals the causal forward."""
    _, ours = _nnx_pair(variant)
    full = ours(X_BTE, mask=nnx.make_causal_mask(jnp.ones((B, T))))
    ours.init_cache(X_BTE.shape)
    steps = [ours(X_BTE[:, t : t + 1], decode=True) for t in range(T)]
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["lssar", "lssa", "ssmax"])
def test_variants_equal_attend_with_the_structured_mask(variant):
    """A dense causal + key-padding mask through the adapter equals attend(causal, kv_mask); Flax's
    is_causal equals causal; a per-head s is passed through."""
    q, k, v = jax.random.normal(jax.random.key(3), (3, B, T, H, 8))
    options = {"s": jnp.linspace(0.5, 1.5, H)} if variant == "ssmax" else {}
    fn = attention.flax_attention_fn(variant, **options)
    mask = nnx.combine_masks(nnx.make_causal_mask(jnp.ones((B, T))), nnx.make_attention_mask(jnp.ones((B, T)), VALID_BT))
    want = attention.attend(q, k, v, variant=variant, kv_mask=VALID_BT, **options)
    np.testing.assert_allclose(fn(q, k, v, mask=mask), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        fn(q, k, v, is_causal=True), attention.attend(q, k, v, variant=variant, **options), rtol=1e-5, atol=1e-6
    )
    assert not np.allclose(fn(q, k, v), want)  # no mask: bidirectional, as in Flax


def test_softmax_bias_equals_flax():
    q, k, v = jax.random.normal(jax.random.key(4), (3, B, T, H, 8))
    bias = jax.random.normal(jax.random.key(5), (B, H, T, T))
    mask = _masks()["causal"]
    want = nnx.dot_product_attention(q, k, v, bias=bias, mask=mask)
    np.testing.assert_allclose(attention.flax_attention_fn("softmax")(q, k, v, bias=bias, mask=mask), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "call, words",
    [
        (dict(bias=jnp.zeros((B, H, T, T))), "bias can only be honoured by variant 'softmax'"),
        (dict(dropout_rate=0.1, deterministic=False), "dropout"),
        (dict(module=object()), "sow_weights"),
        (dict(qk_attn_weights_einsum=jnp.einsum), "einsums"),
    ],
)
def test_what_cannot_be_honoured_raises(call, words):
    q = jnp.ones((B, T, H, 8))
    with pytest.raises(ValueError, match=words):
        attention.flax_attention_fn("lssar")(q, q, q, **call)


def test_mask_options_are_refused():
    with pytest.raises(ValueError, match="takes no mask option"):
        attention.flax_attention_fn("lssar", causal=True)


def test_nnx_jit_and_grad_through_the_adapter():
    """nnx.jit(nnx.grad(loss)) with the adapter gives Flax's own softmax gradients."""
    mask = _masks()["causal_padding"]
    rows = _rows_seeing_something(mask)

    @nnx.jit
    def grads(model):
        return nnx.grad(lambda model: jnp.sum(jnp.where(rows[..., None], model(X_BTE, mask=mask), 0.0) ** 2))(model)

    flax_mha, ours = _nnx_pair()
    got, want = nnx.state(grads(ours), nnx.Param), nnx.state(grads(flax_mha), nnx.Param)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
