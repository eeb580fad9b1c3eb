"""The reference attention against the float64 oracle: values, gradients, masks, N_i, overflow."""

import attention_oracle as oracle
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from freeatten_jax import attention

VARIANTS = list(attention.VARIANTS)


def _case(seed, batch=2, t=9, s=9, h=4, kv_heads=4, d=8, causal=True, **mask):
    """Fresh random q, k, v and the explicit mask arrays the oracle needs."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(batch, t, h, d)).astype(np.float32)
    k = rng.normal(size=(batch, s, kv_heads, d)).astype(np.float32)
    v = rng.normal(size=(batch, s, kv_heads, d)).astype(np.float32)
    offset = mask.get("q_offset", s - t)
    arrays = {
        "q_pos": np.broadcast_to(mask.get("q_positions", offset + np.arange(t)), (batch, t)),
        "kv_pos": np.broadcast_to(mask.get("kv_positions", np.arange(s)), (batch, s)),
        "q_seg": np.broadcast_to(mask.get("q_segment_ids", np.zeros(t, int)), (batch, t)),
        "kv_seg": np.broadcast_to(mask.get("kv_segment_ids", mask.get("q_segment_ids", np.zeros(s, int))), (batch, s)),
        "kv_valid": np.broadcast_to(mask.get("kv_mask", np.ones(s, bool)), (batch, s)),
    }
    m = oracle.visible(**arrays, causal=causal, window=mask.get("window"))
    return q, k, v, m, dict(causal=causal, **mask)


SEGMENTS = np.array([[0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2], [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1]])
RESTARTED = np.array([[0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]])
SCENARIOS = {
    "causal": dict(),
    "bidirectional": dict(causal=False),
    "segments": dict(t=12, s=12, q_segment_ids=SEGMENTS),
    "segments_restarted_positions": dict(t=12, s=12, q_segment_ids=SEGMENTS, q_positions=RESTARTED, kv_positions=RESTARTED),
    "segments_bidirectional": dict(t=12, s=12, causal=False, q_segment_ids=SEGMENTS),
    "padding": dict(kv_mask=np.array([[1] * 6 + [0] * 3, [1] * 9], bool)),
    "padding_bidirectional": dict(causal=False, kv_mask=np.array([[1] * 6 + [0] * 3, [1] * 4 + [0] * 5], bool)),
    "gqa": dict(h=6, kv_heads=2),
    "kv_longer_default_offset": dict(t=4, s=11),
    "kv_longer_explicit_offset": dict(t=4, s=11, q_offset=5),
    "explicit_positions": dict(t=5, s=7, q_positions=np.array([3, 4, 5, 6, 9]), kv_positions=np.array([0, 2, 4, 5, 6, 8, 9])),
    "window": dict(t=10, s=10, window=4),
    "batch_one": dict(batch=1, t=6, s=6),
}


def _options(variant, h, rng):
    """Non-default variant options so per-head and bias paths are exercised."""
    extra = {
        "ssmax": {"s": rng.uniform(0.3, 1.5, size=h).astype(np.float32), "b": rng.uniform(-0.5, 0.5, size=h).astype(np.float32)}
    }
    return extra.get(variant, {})


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_values_match_oracle(variant, scenario):
    q, k, v, m, kwargs = _case(hash((variant, scenario)) % 2**31, **SCENARIOS[scenario])
    opts = _options(variant, q.shape[2], np.random.default_rng(1))
    w = attention.attention_weights(q, k, v, variant=variant, **kwargs, **opts)
    out = attention.attend(q, k, v, variant=variant, implementation="reference", **kwargs, **opts)
    np.testing.assert_allclose(w, oracle.weights(q, k, m, variant, **opts), rtol=2e-4, atol=2e-6)
    np.testing.assert_allclose(out, oracle.attend(q, k, v, m, variant, **opts), rtol=2e-4, atol=2e-5)
    assert out.dtype == jnp.float32 and out.shape == q.shape


@pytest.mark.parametrize("p", [3.0, 1.0, None])
def test_lssar_p_and_off(p):
    q, k, v, m, kwargs = _case(7, **SCENARIOS["segments"])
    w = attention.attention_weights(q, k, v, variant="lssar", p=p, **kwargs)
    np.testing.assert_allclose(w, oracle.weights(q, k, m, "lssar", p=p), rtol=2e-4, atol=2e-6)
    if p is None:  # re-weighting off is LSSA, held to the oracle's LSSA and apart from LSSAR's default p
        np.testing.assert_allclose(w, oracle.weights(q, k, m, "lssa"), rtol=2e-4, atol=2e-6)
        assert np.abs(np.asarray(w) - oracle.weights(q, k, m, "lssar")).max() > 1e-2


@pytest.mark.parametrize("variant", ["lssa", "lssar"])
def test_a_frozen_temperature_uses_log_d_log_l_on_every_row(variant):
    """temperature_length L: the temperature log(d) log(L) for every row (the control of docs/method.md §2); it equals
    the adaptive one only on rows that see exactly L keys."""
    q, k, v, m, kwargs = _case(11, **SCENARIOS["segments"])
    frozen = attention.attention_weights(q, k, v, variant=variant, temperature_length=4, **kwargs)
    np.testing.assert_allclose(frozen, oracle.weights(q, k, m, variant, temperature_length=4), rtol=2e-4, atol=2e-6)
    adaptive = np.asarray(attention.attention_weights(q, k, v, variant=variant, **kwargs))
    same_BT = m.sum(-1) == 4
    np.testing.assert_allclose(
        np.asarray(frozen).transpose(0, 2, 1, 3)[same_BT], adaptive.transpose(0, 2, 1, 3)[same_BT], rtol=1e-5
    )
    assert np.abs(np.asarray(frozen) - adaptive).max() > 1e-3
    traced = jax.jit(lambda length: attention.attention_weights(q, k, v, variant=variant, temperature_length=length, **kwargs))
    # options jitted as arguments (the eval's attention analysis): log(L) then rounds in float32, not in Python, and
    # LSSAR's power p = 15 amplifies that ulp (5.4e-8 on a weight of 4.7e-3 on one CPU; frozen and adaptive differ by 1e-3)
    np.testing.assert_allclose(traced(4.0), frozen, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match=r"temperature_length must be > 1 \(a sequence length\), got 1"):
        attention.attend(q, k, v, variant=variant, temperature_length=1)


def _finite_difference(f, args, eps=1e-5):
    """Central differences of a float64 scalar function w.r.t. each array in args."""
    grads = []
    for a_index, a in enumerate(args):
        g = np.zeros_like(a, np.float64)
        for idx in np.ndindex(a.shape):
            plus, minus = [np.array(x, np.float64) for x in args], [np.array(x, np.float64) for x in args]
            plus[a_index][idx] += eps
            minus[a_index][idx] -= eps
            g[idx] = (f(*plus) - f(*minus)) / (2 * eps)
        grads.append(g)
    return grads


@pytest.mark.parametrize("variant", VARIANTS)
def test_gradients_match_finite_differences(variant):
    """jax.grad (float32) vs float64 finite differences of the oracle, with segments, GQA and an offset."""
    mask = dict(q_segment_ids=np.array([0, 0, 1, 1, 1]), kv_segment_ids=np.array([0, 0, 0, 0, 1, 1, 1]))
    q, k, v, m, kwargs = _case(11, batch=1, t=5, s=7, h=2, kv_heads=1, d=4, **mask)
    cotangent = np.random.default_rng(3).normal(size=q.shape)
    s = np.array([0.8, 1.3])
    has_s = variant == "ssmax"

    def loss(q, k, v, *s_arg):
        opts = {"s": s_arg[0]} if has_s else {}
        return jnp.sum(attention.attend(q, k, v, variant=variant, implementation="reference", **kwargs, **opts) * cotangent)

    def loss64(q, k, v, *s_arg):
        opts = {"s": s_arg[0]} if has_s else {}
        return float(np.sum(oracle.attend(q, k, v, m, variant, **opts) * cotangent))

    args = (q, k, v, s.astype(np.float32)) if has_s else (q, k, v)
    got = jax.grad(loss, argnums=tuple(range(len(args))))(*args)
    want = _finite_difference(loss64, args)
    for g, w in zip(got, want):
        assert np.abs(np.asarray(g) - w).max() <= 2e-3 * np.abs(w).max() + 1e-5


def test_ssmax_prescaling_equals_explicit_logits():
    q, k, v, m, kwargs = _case(5, **SCENARIOS["segments"])
    s = jnp.array([0.5, 1.0, 1.5, 2.0])
    n = m.sum(-1)[:, None, :, None]
    logits = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    scaled = s[None, :, None, None] * jnp.log(jnp.maximum(n, 1)) * logits
    explicit = jax.nn.softmax(jnp.where(m[:, None], scaled, -1e30), axis=-1) * m[:, None]
    got = attention.attention_weights(q, k, v, variant="ssmax", s=s, **kwargs)
    np.testing.assert_allclose(got, explicit, rtol=1e-5, atol=1e-6)


def test_ssmax_s_zero_is_uniform_over_visible_keys():
    q, k, v, m, kwargs = _case(6, **SCENARIOS["padding"])
    w = attention.attention_weights(q, k, v, variant="ssmax", s=0.0, **kwargs)
    uniform = m / m.sum(-1, keepdims=True)
    np.testing.assert_allclose(w, np.broadcast_to(uniform[:, None], w.shape), rtol=1e-6)


@pytest.mark.parametrize("variant", ["ssmax", "lssa", "lssar", "sigmoid", "relu"])
def test_n_restarts_per_segment(variant):
    """A packed document's rows equal the same document attended alone (N_i counts only its keys)."""
    seg = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    q, k, v, _, _ = _case(8, batch=1, t=10, s=10, h=2, kv_heads=2)
    packed = attention.attention_weights(q, k, v, variant=variant, q_segment_ids=seg)
    alone = attention.attention_weights(q[:, 4:], k[:, 4:], v[:, 4:], variant=variant)
    np.testing.assert_allclose(packed[:, :, 4:, 4:], alone, rtol=1e-5, atol=1e-7)
    assert float(jnp.abs(packed[:, :, 4:, :4]).max()) == 0.0


@pytest.mark.parametrize("variant", ["ssmax", "lssa", "lssar", "sigmoid", "relu"])
def test_n_is_visible_count_not_sequence_length(variant):
    """Query i of a causal sequence uses N_i = i + 1: its weights equal those of the prefix alone."""
    q, k, v, _, _ = _case(9, batch=1, t=12, s=12)
    full = attention.attention_weights(q, k, v, variant=variant)
    prefix = attention.attention_weights(q[:, :5], k[:, :5], v[:, :5], variant=variant)
    np.testing.assert_allclose(full[:, :, :5, :5], prefix, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("variant", VARIANTS)
def test_causality(variant):
    q, k, v, _, _ = _case(10, t=12, s=12)
    t = 6
    k2, v2 = k.copy(), v.copy()
    k2[:, t + 1 :] = np.random.default_rng(0).normal(size=k2[:, t + 1 :].shape)
    v2[:, t + 1 :] = np.random.default_rng(1).normal(size=v2[:, t + 1 :].shape)
    before = attention.attend(q, k, v, variant=variant, implementation="reference")
    after = attention.attend(q, k2, v2, variant=variant, implementation="reference")
    np.testing.assert_array_equal(before[:, : t + 1], after[:, : t + 1])
    assert not np.allclose(before[:, t + 1 :], after[:, t + 1 :])


@pytest.mark.parametrize("variant", VARIANTS)
def test_fully_masked_rows_are_zero_not_nan(variant):
    q, k, v, _, _ = _case(12, batch=1, t=4, s=4)
    out = attention.attend(
        q,
        k,
        v,
        variant=variant,
        implementation="reference",
        q_segment_ids=np.array([0, 0, 5, 0]),
        kv_segment_ids=np.zeros(4, int),
    )
    assert np.isfinite(out).all() and float(jnp.abs(out[:, 2]).max()) == 0.0


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_lssar_long_peaked_row_is_finite(dtype):
    """At N = 16384 a peaked row has N A0 - 1 far above 370, where float32 x**15 overflows."""
    rng = np.random.default_rng(13)
    n, d = 16384, 64
    direction = rng.normal(size=d)
    k = (0.3 * rng.normal(size=(1, n, 1, d)) - direction).astype(np.float32)  # keys facing away...
    k[0, n // 3, 0] = direction  # ...but one
    q = direction[None, None, None].astype(np.float32)  # the last query: it sees every key
    q, k = np.asarray(jnp.asarray(q, dtype), np.float32), np.asarray(jnp.asarray(k, dtype), np.float32)
    m = np.ones((1, 1, n), bool)
    a0 = oracle.weights(q, k, m, "lssa")
    with np.errstate(over="ignore"):
        assert np.isinf(np.float32(n * a0.max() - 1) ** np.float32(15))  # the naive power would overflow
    w = attention.attention_weights(jnp.asarray(q, dtype), jnp.asarray(k, dtype), jnp.asarray(k, dtype), variant="lssar")
    assert np.isfinite(w).all()
    np.testing.assert_allclose(w, oracle.weights(q, k, m, "lssar"), rtol=1e-3, atol=1e-6)
    out = attention.attend(
        jnp.asarray(q, dtype), jnp.asarray(k, dtype), jnp.asarray(k, dtype), variant="lssar", implementation="reference"
    )
    assert out.dtype == dtype and np.isfinite(np.asarray(out, np.float32)).all()


def test_lssar_uniform_row_falls_back_to_lssa():
    q = np.zeros((1, 6, 2, 8), np.float32)  # zero queries: every score equal, nothing above uniform
    k = np.random.default_rng(14).normal(size=(1, 6, 2, 8)).astype(np.float32)
    w = attention.attention_weights(q, k, k, variant="lssar")
    lssa = attention.attention_weights(q, k, k, variant="lssa")
    assert np.isfinite(w).all()
    np.testing.assert_allclose(w, lssa, rtol=1e-6)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
def test_bfloat16_inputs(variant):
    q, k, v, m, kwargs = _case(15, **SCENARIOS["gqa"])
    qb, kb, vb = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    out = attention.attend(qb, kb, vb, variant=variant, implementation="reference", **kwargs)
    assert out.dtype == jnp.bfloat16
    rounded = [np.asarray(x, np.float32) for x in (qb, kb, vb)]
    want = oracle.attend(*rounded, m, variant)
    np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=2e-2, atol=2e-2)
    w = attention.attention_weights(qb, kb, vb, variant=variant, **kwargs)
    assert w.dtype == jnp.float32
    np.testing.assert_allclose(w, oracle.weights(rounded[0], rounded[1], m, variant), rtol=2e-4, atol=2e-6)


def test_jit_and_vmap():
    q, k, v, m, kwargs = _case(16, batch=1, t=6, s=6)
    f = jax.jit(lambda q, k, v: attention.attend(q, k, v, variant="lssar", implementation="reference"))
    stacked = [np.stack([x, 2 * x]) for x in (q, k, v)]
    batched = jax.vmap(f)(*stacked)
    np.testing.assert_allclose(batched[0], f(q, k, v), rtol=1e-6)
    np.testing.assert_allclose(batched[1], oracle.attend(2 * q, 2 * k, 2 * v, m, "lssar"), rtol=2e-4, atol=2e-5)


def test_errors():
    q = np.zeros((1, 4, 2, 8), np.float32)
    with pytest.raises(ValueError, match="softmax, ssmax, lssa, lssar, sigmoid, relu"):
        attention.attend(q, q, q, variant="flash")
    with pytest.raises(ValueError, match="unknown option"):
        attention.attend(q, q, q, variant="softmax", p=3)
    with pytest.raises(
        ValueError,
        match=r"unknown option\(s\) \['pp'\]: variant 'lssar' takes p, temperature_length; implementation 'auto' takes none; "
        r"every variant takes the mask options q_positions, kv_positions",
    ):
        attention.attend(q, q, q, variant="lssar", pp=3)
    with pytest.raises(ValueError, match="variant 'softmax' takes scale; implementation 'blockwise' takes block_q, block_k;"):
        attention.attend(q, q, q, variant="softmax", implementation="blockwise", block=3)
    assert attention.attend(q, q, q, variant="softmax", implementation="blockwise", block_q=2).shape == q.shape
    with pytest.raises(ValueError, match="variant 'lssa' takes temperature_length; implementation 'reference' takes none;"):
        attention.attention_weights(q, q, q, variant="lssa", p=3)
    with pytest.raises(ValueError, match="multiple"):
        attention.attend(np.zeros((1, 4, 3, 8)), q, q, variant="softmax")
    with pytest.raises(ValueError, match="implementation"):
        attention.attend(q, q, q, variant="softmax", implementation="magic")
    with pytest.raises(ValueError, match="not both"):
        attention.attend(q, q, q, variant="softmax", q_offset=0, q_positions=np.arange(4))
