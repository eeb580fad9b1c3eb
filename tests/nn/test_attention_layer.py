"""The NNX Attention layer: wiring to attend, RoPE, GQA, learnable SSMax s, switches, dtypes, cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import hf_inverse_frequencies

from freeatten_jax import attention
from freeatten_jax.nn import Attention
from freeatten_jax.nn.rope import Scaling, apply_rope, frequencies

E, H, T = 32, 4, 12
VARIANTS = list(attention.VARIANTS)


def _x(seed=0, b=2, t=T):
    return jax.random.normal(jax.random.key(seed), (b, t, E))


def _rope_numpy(x, positions, theta):
    """RoPE in float64 as complex multiplication of (x_f, x_{f+D/2}) pairs by e^{i pos theta^(-2f/D)}."""
    d = x.shape[-1]
    z = x[..., : d // 2] + 1j * x[..., d // 2 :]
    angle = positions[:, :, None, None] * theta ** (-np.arange(0, d, 2) / d)
    z = z * np.exp(1j * angle)
    return np.concatenate([z.real, z.imag], axis=-1)


def test_rope_matches_complex_rotation_and_is_relative():
    x = np.random.default_rng(0).normal(size=(2, 5, 3, 8))
    positions = np.array([[0, 1, 2, 7, 100], [3, 4, 5, 6, 2000]])
    got = apply_rope(jnp.asarray(x, jnp.float32), positions, 500.0)
    np.testing.assert_allclose(got, _rope_numpy(x, positions, 500.0), atol=1e-4)  # float32 angles up to 2000 rad
    q, k = jnp.asarray(x[:1, :1], jnp.float32), jnp.asarray(x[:1, 1:2], jnp.float32)
    score = lambda m, n: jnp.sum(apply_rope(q, jnp.array([[m]]), 1e4) * apply_rope(k, jnp.array([[n]]), 1e4))
    np.testing.assert_allclose(score(3, 1), score(103, 101), rtol=1e-4)  # depends on m - n only


# Llama 3.1's RoPE (config.json's rope_parameters): with D = 128 its wavelengths fall in each of llama3's three bands
LLAMA31_ROPE = dict(
    rope_theta=500_000.0,
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)
SCALINGS = {  # our scaling -> Hugging Face's rope_parameters of the same
    Scaling(): dict(rope_theta=500_000.0),
    Scaling("linear", 4.0): dict(rope_theta=500_000.0, rope_type="linear", factor=4.0),
    Scaling("llama3", 8.0, 1.0, 4.0, 8192): LLAMA31_ROPE,
}


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s.kind)
def test_rope_frequencies_follow_hugging_faces_definitions(scaling):
    """none, linear and llama3 give the frequencies of Hugging Face's rope_type of the same name (its definitions in
    float64, tests/helpers.py); Llama 3.1's are divided by 8 in one band, kept in another and blended in the third."""
    theirs_F = hf_inverse_frequencies(128, **SCALINGS[scaling])
    np.testing.assert_allclose(frequencies(128, 500_000.0, scaling), theirs_F, rtol=2e-6)
    plain_F = 500_000.0 ** (-np.arange(0, 128, 2) / 128)
    if scaling.kind == "llama3":
        bands = np.isclose(theirs_F, plain_F / 8, rtol=1e-12), np.isclose(theirs_F, plain_F, rtol=1e-12)
        assert bands[0].sum() > 0 and bands[1].sum() > 0 and (~bands[0] & ~bands[1]).sum() > 0


def test_an_unknown_rope_scaling_is_refused_naming_it():
    with pytest.raises(ValueError, match="unknown RoPE scaling 'yarn'; valid: none, linear, llama3"):
        Scaling("yarn", 4.0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_layer_is_projections_rope_and_attend(variant):
    """The layer's output equals hand-wired projections + RoPE + attention.attend of that variant."""
    layer = Attention(E, H, num_kv_heads=2, variant=variant, rope_theta=100.0, rngs=nnx.Rngs(1))
    x, positions = _x(), jnp.arange(T)
    q = apply_rope(jnp.einsum("bte,ehd->bthd", x, layer.wq_EHD[...]), positions, 100.0)
    k = apply_rope(jnp.einsum("bte,ehd->bthd", x, layer.wk_EKD[...]), positions, 100.0)
    v = jnp.einsum("bte,ehd->bthd", x, layer.wv_EKD[...])
    extra = {"s": layer.s_H[...]} if variant == "ssmax" else {}
    out = attention.attend(q, k, v, variant=variant, **extra)
    want = jnp.einsum("bthd,hde->bte", out, layer.wo_HDE[...])
    np.testing.assert_allclose(layer(x), want, atol=1e-5)


def test_unknown_variant_or_option_raises():
    with pytest.raises(ValueError, match="unknown attention variant 'flash'.*softmax.*lssar"):
        Attention(E, H, variant="flash", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="unknown option.*'p'"):
        Attention(E, H, variant="lssa", options={"p": 3.0}, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="unknown option.*'s'"):
        Attention(E, H, variant="ssmax", options={"s": 1.0}, rngs=nnx.Rngs(0))  # s is a parameter
    layer = Attention(E, H, variant="lssa", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="needs the learnable s"):
        layer.set_attention("ssmax")


def test_ssmax_s_is_learnable_per_head_with_documented_init():
    layer = Attention(E, H, variant="ssmax", ssmax_bias=True, rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(layer.s_H[...], np.ones(H))  # layer default: 1.0
    np.testing.assert_array_equal(layer.b_H[...], np.zeros(H))
    x = _x()
    loss = lambda m: jnp.sum(m(x) ** 2)
    grads = nnx.grad(loss)(layer)
    for name in ("s_H", "b_H"):
        g = np.asarray(grads[name][...])
        assert g.shape == (H,) and np.all(np.abs(g) > 0) and len(set(g.tolist())) == H, (name, g)
    assert Attention(E, H, variant="ssmax", ssmax_s_init=0.25, rngs=nnx.Rngs(0)).s_H[...][0] == 0.25
    assert Attention(E, H, variant="softmax", rngs=nnx.Rngs(0)).s_H is None


def test_gqa_equals_mha_with_repeated_kv_heads():
    gqa = Attention(E, H, num_kv_heads=2, variant="lssa", rngs=nnx.Rngs(3))
    mha = Attention(E, H, variant="lssa", rngs=nnx.Rngs(4))
    mha.wq_EHD[...] = gqa.wq_EHD[...]
    mha.wo_HDE[...] = gqa.wo_HDE[...]
    mha.wk_EKD[...] = jnp.repeat(gqa.wk_EKD[...], H // 2, axis=1)  # query head h uses kv head h // G
    mha.wv_EKD[...] = jnp.repeat(gqa.wv_EKD[...], H // 2, axis=1)
    assert gqa.wk_EKD.shape == (E, 2, E // H)
    np.testing.assert_allclose(gqa(_x()), mha(_x()), atol=1e-5)


def test_eval_time_switches_change_no_parameters():
    """lssa -> lssar(p) and a new theta equal layers built that way; p=None is LSSA again."""
    lssa = Attention(E, H, variant="lssa", rngs=nnx.Rngs(5))
    before = jax.tree.map(np.asarray, nnx.state(lssa, nnx.Param))
    x, base = _x(), lssa(_x())
    lssa.set_attention("lssar", p=3.0)
    lssa.set_rope_theta(500.0)
    built = Attention(E, H, variant="lssar", options={"p": 3.0}, rope_theta=500.0, rngs=nnx.Rngs(5))
    np.testing.assert_allclose(lssa(x), built(x), atol=1e-6)
    assert not np.allclose(lssa(x), base, atol=1e-4)
    lssa.set_attention(p=None)
    lssa.set_rope_theta(10_000.0)
    np.testing.assert_allclose(lssa(x), base, atol=1e-6)
    jax.tree.map(np.testing.assert_array_equal, before, jax.tree.map(np.asarray, nnx.state(lssa, nnx.Param)))


def test_compute_dtype_separate_from_param_dtype_and_bias():
    layer = Attention(E, H, variant="ssmax", use_bias=True, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nnx.state(layer, nnx.Param)))
    assert set(layer.biases.keys()) == {"q_HD", "k_KD", "v_KD", "o_E"}
    layer.biases["o_E"][...] = jnp.full((E,), 0.5)
    y = layer(_x())
    assert y.dtype == jnp.bfloat16
    f32 = Attention(E, H, variant="ssmax", use_bias=True, rngs=nnx.Rngs(0))
    f32.biases["o_E"][...] = jnp.full((E,), 0.5)
    np.testing.assert_allclose(y.astype(jnp.float32), f32(_x()), atol=3e-2)


def test_builds_with_or_without_mesh_and_names_every_parameter():
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
    with jax.set_mesh(mesh):
        inside = Attention(E, H, variant="ssmax", use_bias=True, rngs=nnx.Rngs(0))
    outside = Attention(E, H, variant="ssmax", use_bias=True, rngs=nnx.Rngs(0))
    names = {
        "/".join(map(str, path)): v.get_metadata()["out_sharding"] for path, v in nnx.to_flat_state(nnx.state(outside, nnx.Param))
    }
    assert names["wq_EHD"] == ("embed", "heads", "head_dim")
    assert names["wk_EKD"] == ("embed", "kv_heads", "head_dim")
    assert names["wo_HDE"] == ("heads", "head_dim", "embed")
    assert names["s_H"] == ("heads",)
    assert all(len(n) == v.ndim for n, v in zip(names.values(), jax.tree.leaves(nnx.state(outside, nnx.Param))))
    np.testing.assert_array_equal(inside(_x()), outside(_x()))


@pytest.mark.parametrize("variant", ["ssmax", "lssar"])
def test_layer_cache_decoding_matches_full_pass(variant):
    layer = Attention(E, H, num_kv_heads=2, variant=variant, use_bias=True, rngs=nnx.Rngs(2))
    x = _x(t=T)
    cache = layer.init_cache(2, T + 3)
    decode = nnx.jit(lambda m, x, c: m(x, cache=c))
    pieces = []
    for part in (slice(0, 6), slice(6, 12)):
        y, cache = decode(layer, x[:, part], cache)
        pieces.append(y)
    assert int(cache.length) == T
    np.testing.assert_allclose(jnp.concatenate(pieces, axis=1), layer(x), atol=1e-5)
