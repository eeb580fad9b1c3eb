"""Explicit dense masks (values and gradients), per-head N_i, `scale`, and masked NaN/Inf (SPEC §8).

Glossary: B batch, T queries, S keys, H heads, K kv heads, D head dim. Every comparison runs on the
reference and the blockwise path (small blocks, so masks and padding fall on block edges).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_oracle as oracle
from freeatten_jax import attention
from test_blockwise import _assert_close, _fast_jit, _inputs, _key

VARIANTS = list(attention.VARIANTS)
IMPLEMENTATIONS = {"reference": {}, "blockwise": dict(block_q=8, block_k=8)}


def _params(variant: str, h: int):
    return {"s": jnp.linspace(0.6, 1.4, h), "b": jnp.float32(0.1)} if variant == "ssmax" else {}


def _vjp(fn, q, k, v, g):
    """fn's output and its q, k, v gradients for the cotangent g."""
    out, vjp = jax.vjp(fn, q, k, v)
    return out, vjp(g)


def _check_same(got, want, tolerance=1e-4, what=""):
    for name, x, y in zip(["out", "dq", "dk", "dv"], [got[0], *got[1]], [want[0], *want[1]]):
        _assert_close(x, y, tolerance, f"{what} {name}")


# (b, t, s, h, kv_heads, causal, structured options): edges of segments, padding, windows and
# offsets fall on the 8-wide blocks.
STRUCTURED = {
    "packed_padded_gqa": (2, 19, 19, 4, 2, True, dict(q_segment_ids=jnp.array([[0] * 8 + [1] * 11, [0] * 16 + [1] * 3]), kv_mask=jnp.arange(19) < 16)),
    "cache_offset_window": (2, 9, 24, 2, 1, True, dict(q_offset=jnp.array([8, 15]), window=8)),
    "bidirectional_padding": (1, 16, 16, 2, 2, False, dict(kv_mask=jnp.arange(16) < 8)),
}


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_dense_mask_equals_structured_mask(variant, implementation):
    """The structured mask given as a dense [B, 1, T, S] mask (causal off) gives the same values and
    gradients; the dense path runs on `implementation`, the structured one on the reference."""
    inputs = [_inputs(_key(variant, name), b, t, s, h, kv_heads, 8) for name, (b, t, s, h, kv_heads, _, _) in STRUCTURED.items()]

    def run(inputs):
        results = []
        for (q, k, v, g), (b, t, s, h, _, causal, options) in zip(inputs, STRUCTURED.values()):
            dense = attention.make_mask(b, t, s, causal=causal, **options).visible()
            params = _params(variant, h)
            attend = functools.partial(attention.attend, variant=variant, **params)
            structured = functools.partial(attend, causal=causal, implementation="reference", **options)
            from_dense = functools.partial(attend, causal=False, mask=dense, implementation=implementation, **IMPLEMENTATIONS[implementation])
            results.append((_vjp(from_dense, q, k, v, g), _vjp(structured, q, k, v, g)))
        return results

    for name, (got, want) in zip(STRUCTURED, _fast_jit(run, inputs)):
        _check_same(got, want, what=name)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_per_head_mask_equals_per_head_runs(variant, implementation):
    """A [B, H, T, S] mask (head h: causal window 2h + 3, GQA) equals attending head by head with that
    window: N_i is counted per head."""
    b, t, h, kv_heads = 2, 17, 4, 2
    q, k, v, g = _inputs(_key("per-head", variant), b, t, t, h, kv_heads, 8)
    windows = [2 * head + 3 for head in range(h)]
    dense_BHTS = jnp.concatenate([attention.make_mask(b, t, t, window=w).visible() for w in windows], axis=1)
    params = _params(variant, h)

    def per_head(q, k, v):
        outs = []
        for head, window in enumerate(windows):
            kv = slice(head // (h // kv_heads), head // (h // kv_heads) + 1)
            head_params = {name: x if jnp.ndim(x) == 0 else x[head : head + 1] for name, x in params.items()}
            out = attention.attend(q[:, :, head : head + 1], k[:, :, kv], v[:, :, kv], variant=variant, window=window, implementation="reference", **head_params)
            outs.append(out)
        return jnp.concatenate(outs, axis=2)

    dense = functools.partial(
        attention.attend, variant=variant, mask=dense_BHTS, implementation=implementation, **params, **IMPLEMENTATIONS[implementation]
    )
    got, want = _fast_jit(lambda q, k, v, g: (_vjp(dense, q, k, v, g), _vjp(per_head, q, k, v, g)), q, k, v, g)
    _check_same(got, want, what="per head")


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_random_dense_mask_matches_oracle(variant, implementation):
    """An arbitrary dense mask (with a fully hidden row), ANDed with causal + a KV-cache offset: values
    and weights against the float64 oracle, N_i being the combined mask's row sum."""
    b, t, s = 2, 11, 21
    q, k, v, _ = _inputs(_key("random", variant), b, t, s, 2, 1, 8)
    random_B1TS = jax.random.bernoulli(_key("random-mask", variant), 0.6, (b, 1, t, s)).at[1, 0, 3].set(False)
    combined = np.asarray(random_B1TS[:, 0]) & np.asarray(attention.make_mask(b, t, s, q_offset=jnp.array([3, 10])).visible()[:, 0])
    options = dict(variant=variant, mask=random_B1TS, q_offset=jnp.array([3, 10]))
    out = _fast_jit(
        lambda q, k, v: attention.attend(q, k, v, implementation=implementation, **options, **IMPLEMENTATIONS[implementation]), q, k, v
    )
    _assert_close(out, oracle.attend(q, k, v, combined, variant), 1e-4, "values")
    assert float(jnp.abs(out[1, 3]).max()) == 0.0  # N_i = 0: zeros
    _assert_close(attention.attention_weights(q, k, v, **options), oracle.weights(q, k, combined, variant), 1e-4, "weights")


@pytest.mark.parametrize("variant", ["softmax", "ssmax", "sigmoid", "relu"])
def test_scale_replaces_inverse_sqrt_d(variant):
    """scale=c is the default with q multiplied by c·sqrt(d)."""
    q, k, v, _ = _inputs(_key("scale", variant), 1, 7, 7, 2, 2, 16)
    scaled = attention.attend(q, k, v, variant=variant, scale=0.3, implementation="reference")
    want = attention.attend(q * (0.3 * 4.0), k, v, variant=variant, implementation="reference")
    _assert_close(scaled, want, 1e-5, "scale")
    assert not np.allclose(scaled, attention.attend(q, k, v, variant=variant, implementation="reference"))
