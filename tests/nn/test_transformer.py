"""The transformer: parameter counts of the paper presets, config validation, packing, causality,
dropout, remat, dtypes and the eval-time attention / RoPE switches."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import walk_eqns

from freeatten_jax.errors import ConfigError, UserError
from freeatten_jax.nn import ModelConfig, Transformer, preset, together
from freeatten_jax.nn.rope import apply_rope


def _cfg(**overrides):
    return preset(
        "tiny", **{"num_layers": 1, "d_model": 32, "num_heads": 4, "mlp_dim": 64, "vocab_size": 50, "max_len": 16, **overrides}
    )


forward = nnx.jit(lambda model, tokens: model(tokens))


def _tokens(seed=0, b=2, t=12):
    return jax.random.randint(jax.random.key(seed), (b, t), 0, 50)


def _param_count(cfg):
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))  # shapes only: nothing allocated
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


@pytest.mark.parametrize("size, paper", [("gpt2_small", 124e6), ("ssmax_162m", 162e6)])
def test_paper_presets_parameter_counts(size, paper):
    count = _param_count(preset(size))
    assert abs(count - paper) / paper < 0.01, count


def test_tied_embeddings_share_the_table():
    assert _param_count(_cfg(tie_embeddings=False)) - _param_count(_cfg()) == 50 * 32


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("mlp", "relu2", "'gelu', 'swiglu'"),
        ("attention", "flash", "'softmax'"),
        ("norm", "batchnorm", "'layernorm', 'rmsnorm'"),
        ("remat", "some", "'none', 'dots', 'full'"),
        ("dtype", "float16", "'float32', 'bfloat16'"),
        ("vocab_size", 0, "an integer >= 1"),
        ("ssmax_s_init", -1.0, "None"),
        ("use_bias", 1, "True or False"),
    ],
)
def test_model_config_names_field_and_allowed_values(field, value, allowed):
    with pytest.raises(ConfigError, match=rf"model\.{field}=.* is invalid; allowed: .*{allowed}") as info:
        _cfg(**{field: value})
    assert "\n" not in str(info.value) and isinstance(info.value, UserError) and isinstance(info.value, ValueError)


def test_model_config_rejects_inconsistent_shapes_and_options():
    with pytest.raises(ConfigError, match="num_kv_heads=3 must divide num_heads=4"):
        _cfg(num_kv_heads=3)
    with pytest.raises(ConfigError, match="unknown option.*'q'"):
        _cfg(attention="lssar", attention_options={"q": 1.0})
    with pytest.raises(ConfigError, match="unknown option.*'s'"):
        _cfg(attention="ssmax", attention_options={"s": 1.0})  # s is a parameter
    with pytest.raises(ConfigError, match=r"^model\.attention_options: p must be > 0 and finite, got -3.0$"):
        _cfg(attention="lssar", attention_options={"p": -3.0})  # a value, checked where the names are
    cfg = _cfg(attention="lssar", attention_options={"p": 3.0}, num_kv_heads=2, dtype="bfloat16")
    assert cfg.dtype == jnp.bfloat16 and cfg.replace(dtype=jnp.float32).dtype == jnp.float32
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_layers = 3


def test_model_config_is_plain_python():
    """The typed config needs no ml_collections: every field has a real type, equal configs compare equal."""
    a = ModelConfig(vocab_size=50, num_layers=1, num_heads=4, d_model=32, mlp_dim=64)
    assert a == ModelConfig(vocab_size=50, num_layers=1, num_heads=4, d_model=32, mlp_dim=64, dtype="float32")
    assert a.initial_ssmax_s == pytest.approx(1 / math.log(1024))


def test_ssmax_s_init_default_makes_the_factor_one_at_training_length():
    model = Transformer(_cfg(attention="ssmax"), rngs=nnx.Rngs(0))
    np.testing.assert_allclose(model.blocks[0].attn.s_H[...] * math.log(16), 1.0, rtol=1e-6)
    model = Transformer(_cfg(attention="ssmax", ssmax_s_init=0.5), rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(model.blocks[0].attn.s_H[...], 0.5)


@pytest.mark.parametrize("variant", ["softmax", "lssar", "ssmax"])
def test_causal_and_packing_aware(variant):
    """Future tokens never change past logits; a packed row equals its documents run separately."""
    model = Transformer(_cfg(attention=variant, mlp="swiglu", norm="rmsnorm", use_bias=True), rngs=nnx.Rngs(0))
    packed_forward = nnx.jit(lambda m, t, p, s: m(t, positions_BT=p, segment_ids_BT=s))
    tokens = _tokens()
    changed = tokens.at[:, 8:].set((tokens[:, 8:] + 1) % 50)
    np.testing.assert_array_equal(forward(model, tokens)[:, :8], forward(model, changed)[:, :8])
    segments = jnp.array([[0] * 5 + [1] * 7] * 2)
    positions = jnp.array([list(range(5)) + list(range(7))] * 2)
    packed = packed_forward(model, tokens, positions, segments)
    np.testing.assert_allclose(packed[:, :5], forward(model, tokens[:, :5]), atol=1e-5)
    np.testing.assert_allclose(packed[:, 5:], forward(model, tokens[:, 5:]), atol=1e-5)


def test_bf16_compute_keeps_fp32_params_and_logits():
    model = Transformer(_cfg(dtype="bfloat16"), rngs=nnx.Rngs(0))
    logits = forward(model, _tokens())
    assert logits.dtype == jnp.float32 and logits.shape == (2, 12, 50)
    assert {p.dtype for p in jax.tree.leaves(nnx.state(model, nnx.Param))} == {jnp.dtype(jnp.float32)}
    f32 = Transformer(_cfg(), rngs=nnx.Rngs(0))
    np.testing.assert_allclose(logits, forward(f32, _tokens()), atol=5e-2)


def test_dropout_follows_train_and_eval():
    model = Transformer(_cfg(dropout=0.5), rngs=nnx.Rngs(0, dropout=1))
    plain = Transformer(_cfg(), rngs=nnx.Rngs(0, dropout=1))  # same streams: same init
    tokens = _tokens()
    first, second = forward(model, tokens), forward(model, tokens)
    assert not np.allclose(first, second)
    model.eval()
    np.testing.assert_allclose(forward(model, tokens), forward(plain, tokens), atol=1e-6)
    model.train()
    assert not np.allclose(forward(model, tokens), forward(plain, tokens))


def test_remat_policies_give_the_same_gradients_and_none_adds_no_remat():
    tokens = _tokens()
    loss = lambda m: jnp.mean(jax.nn.log_softmax(m(tokens))[..., 0])
    models = {remat: Transformer(_cfg(remat=remat, attention="ssmax"), rngs=nnx.Rngs(0)) for remat in ("none", "dots", "full")}
    grads = {remat: nnx.jit(nnx.grad(loss))(model) for remat, model in models.items()}
    for remat in ("dots", "full"):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), grads["none"], grads[remat])
    jaxpr = lambda m: str(jax.make_jaxpr(lambda s: nnx.grad(loss)(nnx.merge(nnx.graphdef(m), s)))(nnx.state(m)))
    assert "remat" not in jaxpr(models["none"]) and "remat" in jaxpr(models["full"])


def test_each_projections_and_blocks_backward_hands_out_its_gradients_together():
    """q, k, v, o and the MLP's two projections each end their backward in one optimization barrier over the input's
    and the weight's gradients, and each block in one over its parameters' and its input's (nn.together: XLA then
    cannot postpone a weight, bias or norm gradient past a later layer, which kept that layer's activations alive:
    8 x H100 at 512K, 1.44 -> 0.56 GiB a layer); a projection's values and gradients are jnp.einsum's, bit for bit."""
    layers, tokens = 2, _tokens()
    model = Transformer(_cfg(num_layers=layers, remat="full"), rngs=nnx.Rngs(0))
    loss = lambda m: jnp.mean(jax.nn.log_softmax(m(tokens))[..., 0])  # noqa: E731
    jaxpr = jax.make_jaxpr(lambda s: nnx.grad(loss)(nnx.merge(nnx.graphdef(model), s)))(nnx.state(model)).jaxpr
    barriers = [e for e in walk_eqns(jaxpr) if e.primitive.name == "optimization_barrier"]
    weights = {tuple(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param))}
    projections = [e for e in barriers if len(e.outvars) == 2]
    assert len(projections) == 6 * layers and all(tuple(e.outvars[1].aval.shape) in weights for e in projections)
    per_block = len(jax.tree.leaves(nnx.state(model.blocks[0], nnx.Param))) + 1
    assert [len(e.outvars) for e in barriers if len(e.outvars) > 2] == [per_block] * layers
    x, w, g = (jax.random.normal(jax.random.key(i), shape) for i, shape in enumerate([(2, 5, 8), (8, 3, 4), (2, 5, 3, 4)]))
    spec = "BTE,END->BTND"
    ours, plain = (jax.vjp(f, x, w) for f in (functools.partial(together.dense, spec), functools.partial(jnp.einsum, spec)))
    np.testing.assert_array_equal(ours[0], plain[0])
    for got, want in zip(ours[1](g), plain[1](g)):
        np.testing.assert_array_equal(got, want)


def test_attention_qk_captures_the_forward_passes_queries_and_keys():
    """The captured q, k (after RoPE) reproduce each layer's attention: analysis sees the real model."""
    model = Transformer(_cfg(attention="lssar", num_layers=2, num_kv_heads=2, use_bias=True), rngs=nnx.Rngs(0))
    tokens = _tokens()
    logits, qk = nnx.jit(lambda m, t: m.attention_qk(t))(model, tokens)
    np.testing.assert_allclose(logits, forward(model, tokens), atol=1e-6)
    assert [(q.shape, k.shape) for q, k in qk] == [((2, 12, 4, 8), (2, 12, 2, 8))] * 2
    assert not nnx.state(model, nnx.Intermediate)  # nothing left behind, capture off again
    assert all(not layer.capture for layer in model.attention_layers)
    layer = model.attention_layers[0]
    x = model.blocks[0].attn_norm(jnp.take(model.embed_VE[...], tokens, axis=0))
    q_want = jnp.einsum("BTE,EHD->BTHD", x, layer.wq_EHD[...]) + layer.biases["q_HD"][...]
    q_want = apply_rope(q_want, jnp.arange(12), layer.rope_theta)
    np.testing.assert_allclose(qk[0][0], q_want, atol=1e-5)


def test_set_ssmax_s_overrides_every_layer_and_head():
    model = Transformer(_cfg(attention="ssmax", num_layers=2), rngs=nnx.Rngs(0))
    tokens = _tokens()
    base = forward(model, tokens)
    model.set_ssmax_s(0.5)
    assert all(np.all(layer.variant_options()["s"] == 0.5) for layer in model.attention_layers)
    assert not np.allclose(forward(model, tokens), base, atol=1e-4)
    with pytest.raises(ValueError, match="ssmax"):
        Transformer(_cfg(), rngs=nnx.Rngs(0)).set_ssmax_s(0.5)


def test_set_attention_and_rope_theta_at_eval_time():
    """An LSSA model switched to lssar(p=15) and theta 1e5 equals one built that way; params unchanged."""
    model = Transformer(_cfg(attention="lssa"), rngs=nnx.Rngs(0))
    tokens = _tokens()
    base = forward(model, tokens)
    model.set_attention("lssar", p=15.0)
    model.set_rope_theta(1e5)
    built = Transformer(_cfg(attention="lssar", attention_options={"p": 15.0}, rope_theta=1e5), rngs=nnx.Rngs(0))
    switched = forward(model, tokens)
    np.testing.assert_allclose(switched, forward(built, tokens), atol=1e-6)
    assert not np.allclose(switched, base, atol=1e-4)
    with pytest.raises(ValueError, match="unknown attention variant"):
        model.set_attention("flash")
    with pytest.raises(ValueError, match="unknown implementation"):
        model.set_implementation("magic")
