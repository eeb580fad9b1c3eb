"""Blockwise attention equals the reference (values and gradients) for every variant and mask kind.

Glossary: B batch, T queries, S keys, H heads, K kv heads, D head dim. Tolerances: float32 inputs
agree to 1e-4 relative (both paths are float32; they differ only in summation order), bfloat16
inputs to 2e-2 relative (one bfloat16 rounding of outputs and gradients).
"""

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TOLERANCE, assert_close, compare, inputs, jit_call, key, variant_params

from freeatten_jax import attention
from freeatten_jax.attention import auto, block_plan, blockwise, reference

BLOCKS = dict(block_q=16, block_k=8)  # several blocks, and lengths below are not multiples of them
BLOCKWISE = dict(implementation="blockwise", **BLOCKS)


def _scenario(name: str, key):
    """(q, k, v, cotangent, causal, mask options) for one mask scenario."""
    if name == "causal_packed_padded":  # segments, padding, a fully masked row, GQA, odd length
        q, k, v, g = inputs(key, 2, 37, 37, 4, 2, 16)
        segments = jnp.array([[0] * 20 + [1] * 17, [0] * 9 + [1] * 21 + [2] * 7])
        kv_mask = jnp.array([[True] * 37, [True] * 30 + [False] * 7])  # segment 2 of row 1 sees nothing
        return q, k, v, g, True, dict(q_segment_ids=segments, kv_mask=kv_mask)
    if name == "bidirectional_window_positions":  # unsorted explicit positions, kv_len > q_len, padding, MQA
        q, k, v, g = inputs(key, 2, 23, 41, 4, 1, 8)
        q_positions = jax.random.permutation(jax.random.fold_in(key, 1), 41)[:23]
        options = dict(q_positions=q_positions, kv_positions=jnp.arange(41), window=15, kv_mask=jnp.arange(41) < 36)
        return q, k, v, g, False, options
    if name == "kv_cache_offset_bfloat16":  # kv_len > q_len, per-sequence offsets, bfloat16 inputs
        q, k, v, g = inputs(key, 2, 11, 45, 4, 2, 16, jnp.bfloat16)
        return q, k, v, g, True, dict(q_offset=jnp.array([30, 34]))
    raise ValueError(name)


SCENARIOS = ["causal_packed_padded", "bidirectional_window_positions", "kv_cache_offset_bfloat16"]


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("variant", list(attention.VARIANTS))
def test_blockwise_matches_reference(variant, scenario):
    q, k, v, g, causal, mask_options = _scenario(scenario, key(variant, scenario))
    params = variant_params(variant, q.shape[2])
    compare(q, k, v, g, params, BLOCKWISE, TOLERANCE[q.dtype.type], variant=variant, causal=causal, **mask_options)


@pytest.mark.parametrize("p", [None, 2.5, "traced"])
def test_lssar_power_options(p):
    """p=None (off) is LSSA; fractional and traced (a jit argument) powers match the reference in value
    and in the q, k, v gradients (blockwise does not differentiate p)."""
    q, k, v, g, causal, mask_options = _scenario("causal_packed_padded", key("lssar", str(p)))
    params, static = ({"p": jnp.float32(7.0)}, {}) if p == "traced" else ({}, {"p": p})
    out = compare(q, k, v, g, params, BLOCKWISE, 1e-4, variant="lssar", causal=causal, **mask_options, **static)  # traced: dp too
    if p is None:
        lssa = attention.attend(q, k, v, variant="lssa", implementation="reference", **mask_options)
        assert_close(out, lssa, 1e-5, "p=None is LSSA")


@pytest.mark.parametrize("fast", ["blockwise", "pallas"])
def test_a_frozen_temperature_reaches_the_fast_paths(fast):
    """temperature_length is applied where every implementation takes its per-row factors (variants.scales): the
    blockwise and Pallas (interpret mode) paths equal the reference, values and gradients, with segments and GQA."""
    q, k, v, g, causal, mask_options = _scenario("causal_packed_padded", key("lssar", "frozen", fast))
    implementation = BLOCKWISE if fast == "blockwise" else dict(implementation="pallas", interpret=True, **BLOCKS)
    options = dict(variant="lssar", causal=causal, temperature_length=16.0, **mask_options)
    out = compare(q, k, v, g, {}, implementation, 1e-4, **options)
    assert np.abs(np.asarray(out - attention.attend(q, k, v, variant="lssar", **mask_options))).max() > 1e-3


def test_lssar_uniform_row_keeps_lssa_weights():
    """Identical keys make every row uniform (nothing above 1/N): the output is the mean of the visible values."""
    q, _, v, _ = inputs(key("uniform"), 1, 20, 20, 2, 2, 8)
    k = jnp.broadcast_to(jax.random.normal(key("uniform-k"), (1, 1, 2, 8)), (1, 20, 2, 8))
    out = jit_call(lambda q, k, v: attention.attend(q, k, v, variant="lssar", implementation="blockwise", **BLOCKS), q, k, v)
    mean_BTKD = jnp.cumsum(v, axis=1) / jnp.arange(1, 21)[None, :, None, None]
    assert_close(out, mean_BTKD, 1e-5, "uniform rows")


def test_lssar_long_peaked_row_is_finite():
    """The last query sees 1024 keys and points at one of them: x = N A0 - 1 ~ 1000, so x^15 overflows float32."""
    q, k, v, g = inputs(key("peaked"), 1, 1024, 1024, 1, 1, 16)
    e_D = jnp.zeros(16).at[0].set(1.0)
    k = (0.1 * k - e_D).at[0, 700, 0].set(e_D)  # every key points away from e, except key 700
    q = q.at[0, -1, 0].set(e_D)
    out = compare(q, k, v, g, {}, BLOCKWISE, 1e-3, variant="lssar", causal=True)
    assert_close(out[0, -1], v[0, 700], 1e-5, "the peak takes all the weight")


def test_vmap_and_grad_of_jit():
    """vmap over an extra leading axis (inputs, or the mask through q_offset) equals a loop; grad of a
    jitted scalar loss equals the reference's."""
    q, k, v, _ = inputs(key("vmap"), 3, 19, 19, 2, 1, 8)
    offsets = jnp.array([0, 5, 11])

    def check(implementation, q, k, v):
        attend = functools.partial(attention.attend, variant="lssa", implementation=implementation)
        attend = functools.partial(attend, **BLOCKS) if implementation == "blockwise" else attend
        per_input = jax.vmap(lambda q, k, v: attend(q[None], k[None], v[None])[0])(q, k, v)
        per_offset = jax.vmap(lambda offset: attend(q[:1, :8], k[:1], v[:1], q_offset=offset))(offsets)
        return per_input, attend(q, k, v), per_offset, jax.grad(jax.jit(lambda q: jnp.sum(attend(q, k, v) ** 2)))(q)

    per_input, looped, per_offset, grad = jit_call(functools.partial(check, "blockwise"), q, k, v)
    _, looped_ref, per_offset_ref, grad_ref = jit_call(functools.partial(check, "reference"), q, k, v)
    assert_close(per_input, looped, 1e-5, "vmap over inputs")
    assert_close(looped, looped_ref, 1e-4, "values")
    assert_close(per_offset, per_offset_ref, 1e-4, "vmap over the mask")
    assert_close(grad, grad_ref, 1e-4, "grad")


@pytest.mark.parametrize("causal", [True, False])
def test_block_skipping_is_conservative(causal):
    """A block pair marked invisible never holds a visible pair (random positions, segments, padding, window)."""
    keys = jax.random.split(key("skip", str(causal)), 4)
    q_positions = jax.random.randint(keys[0], (2, 50), 0, 60)
    kv_segments = jnp.sort(jax.random.randint(keys[1], (2, 60), 0, 4), axis=1)
    q_segments = jnp.sort(jax.random.randint(keys[2], (2, 50), 0, 4), axis=1)
    mask = attention.make_mask(
        2,
        50,
        60,
        causal=causal,
        q_positions=q_positions,
        q_segment_ids=q_segments,
        kv_segment_ids=kv_segments,
        kv_mask=jax.random.bernoulli(keys[3], 0.8, (2, 60)),
        window=20,
    )
    maybe_IJ = jit_call(lambda mask: blockwise.make_plan(mask, block_plan.count_visible(mask, 8)[0], 8, 8, 1).maybe_IJ, mask)
    visible_TS = np.pad(np.any(mask.visible(), axis=(0, 1)), ((0, 6), (0, 4)))
    visible_IJ = visible_TS.reshape(7, 8, 8, 8).any(axis=(1, 3))
    assert not np.any(visible_IJ & ~np.asarray(maybe_IJ))
    assert not np.all(maybe_IJ)  # and something is skipped


def test_count_visible_and_block_skipping():
    """N_i equals the dense count; key blocks strictly above the causal diagonal are skipped."""
    segments = jnp.array([[0] * 25 + [1] * 15] * 2)
    mask = attention.make_mask(2, 40, 40, q_segment_ids=segments, kv_mask=jnp.arange(40) < 37, window=30)
    np.testing.assert_array_equal(
        jit_call(lambda mask: block_plan.count_visible(mask, 8)[0], mask), jnp.sum(mask.visible(), axis=-1)
    )
    plain = attention.make_mask(1, 64, 64)
    maybe_IJ = jit_call(lambda mask: blockwise.make_plan(mask, jnp.zeros((1, 1, 64), jnp.int32), 16, 16, 1).maybe_IJ, plain)
    np.testing.assert_array_equal(maybe_IJ, np.tril(np.ones((4, 4), bool)))


def _temp_bytes(implementation: str, t: int) -> int:
    q, k, v, _ = inputs(key("memory"), 1, t, t, 2, 2, 16)
    attend = functools.partial(attention.attend, variant="lssar", implementation=implementation)
    loss = lambda q, k, v: jnp.sum(attend(q, k, v))  # noqa: E731
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_memory_is_linear_and_far_below_reference():
    """Compiled temp memory of forward+backward: blockwise far below the reference, growing linearly."""
    blockwise_2k, blockwise_4k = _temp_bytes("blockwise", 2048), _temp_bytes("blockwise", 4096)
    reference_2k = _temp_bytes("reference", 2048)
    assert blockwise_2k * 8 < reference_2k, (blockwise_2k, reference_2k)
    assert blockwise_4k < 2.2 * blockwise_2k, (blockwise_2k, blockwise_4k)


def test_auto_rule():
    """auto: reference for small score tensors; above, cuDNN for fusable softmax on GPU, else the platform's kernels on
    GPU and TPU (blockwise where they do not apply: a dense mask, a head dim not a power of two) and blockwise on CPU."""
    variants = attention.VARIANTS
    shape = lambda t, dtype=jnp.float32, b=1: jax.ShapeDtypeStruct((b, t, 12, 64), dtype)  # noqa: E731
    small, medium, large = shape(64), shape(1024), shape(4096)
    small_bf16, large_bf16 = shape(64, jnp.bfloat16), shape(4096, jnp.bfloat16)

    def choose(q, variant, platform, **mask_options):
        mask = attention.make_mask(q.shape[0], q.shape[1], q.shape[1], **mask_options)
        return auto.choose(q, q, variant=variants[variant], mask=mask, platform=platform)

    assert choose(small, "lssar", "cpu") == "reference"
    assert choose(medium, "lssar", "cpu") == choose(large, "relu", "cpu") == "blockwise"
    assert choose(large_bf16, "ssmax", "gpu") == choose(small_bf16, "softmax", "gpu") == "fused"
    assert choose(medium, "softmax", "gpu") == choose(medium, "lssa", "tpu") == "reference"
    assert choose(large, "softmax", "gpu") == "pallas"  # float32: cuDNN refuses it, the kernels take it
    assert choose(shape(1024, b=128), "lssa", "gpu") == "pallas"  # a 6 GiB score tensor
    assert choose(large_bf16, "lssa", "gpu") == choose(large_bf16, "softmax", "gpu", window=128) == "pallas"
    assert choose(large_bf16, "lssar", "tpu") == choose(large_bf16, "softmax", "tpu") == "pallas"
    dense = dict(mask=jnp.ones((1, 1, 4096, 4096), bool))
    assert choose(large_bf16, "lssa", "gpu", **dense) == choose(large_bf16, "lssa", "tpu", **dense) == "blockwise"
    odd_head = jax.ShapeDtypeStruct((1, 4096, 12, 96), jnp.bfloat16)
    assert choose(odd_head, "lssa", "gpu") == choose(odd_head, "lssa", "tpu") == "blockwise"
    assert choose(large_bf16, "softmax", "cpu") == choose(large_bf16, "lssar", "cpu") == "blockwise"
    q = jnp.zeros((1, 8, 2, 8), jnp.bfloat16)
    fused = dict(variant=variants["softmax"], mask=attention.make_mask(1, 8, 8), opts={})
    assert auto.traces(auto.fused_softmax, q, q, q, implementation="xla", **fused)
    assert not auto.traces(auto.fused_softmax, q, q, q, implementation="cudnn", **fused)  # no cuDNN here: rule 2


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("variant", ["softmax", "ssmax"])
def test_fused_path_matches_reference(variant, causal):
    """The GPU route (run here with the xla kernel), causal and bidirectional: ssmax by query
    pre-scaling with N_i = i + 1 or T, values and gradients equal to the reference."""
    q, k, v, g = inputs(key("fused", variant, str(causal)), 2, 24, 24, 4, 2, 16, jnp.bfloat16)
    mask = attention.make_mask(2, 24, 24, causal=causal)
    spec = attention.VARIANTS[variant]

    def run(implementation, q, k, v, s):
        opts = attention.variant_options(variant, {"s": s, "b": 0.2} if variant == "ssmax" else {"scale": s[0]})
        if implementation == "fused":
            return auto.fused_softmax(q, k, v, variant=spec, mask=mask, opts=opts, implementation="xla")
        return reference.attend(q, k, v, variant=spec, mask=mask, opts=opts)

    def value_and_grads(q, k, v, g, s):
        return [jax.vjp(functools.partial(run, name), q, k, v, s) for name in ("fused", "reference")]

    s = jnp.linspace(0.5, 1.5, 4)
    (out, vjp), (out_ref, vjp_ref) = jit_call(lambda *a: [(o, f(a[3])) for o, f in value_and_grads(*a)], q, k, v, g, s)
    assert_close(out, out_ref, 2e-2, "output")
    for got, want in zip(vjp, vjp_ref):
        assert_close(got, want, 3e-2, "grad")


def test_fused_path_refuses_a_mask_that_is_not_plain():
    """fused_softmax reads no positions, segments, padding or dense mask, so it must refuse them."""
    q = jnp.zeros((1, 8, 2, 8), jnp.bfloat16)
    for mask in (
        attention.make_mask(1, 8, 8, kv_mask=jnp.arange(8) < 5),
        attention.make_mask(1, 8, 8, mask=jnp.ones((1, 1, 8, 8), bool)),
    ):
        with pytest.raises(ValueError, match="plain mask"):
            auto.fused_softmax(q, q, q, variant=attention.VARIANTS["softmax"], mask=mask, opts={}, implementation="xla")


def test_only_statically_plain_masks_are_fused():
    """Positions, segments, padding, a window or an offset make a mask non-plain: no fused kernel."""
    q = jax.ShapeDtypeStruct((1, 64, 12, 64), jnp.bfloat16)
    assert attention.make_mask(1, 64, 64).plain and attention.make_mask(1, 64, 64, causal=False).plain
    for options in (
        dict(q_positions=jnp.arange(64)),
        dict(q_segment_ids=jnp.zeros(64, int)),
        dict(kv_mask=jnp.ones(64, bool)),
        dict(window=8),
        dict(q_offset=0),
        dict(mask=jnp.ones((1, 1, 64, 64), bool)),
    ):
        mask = attention.make_mask(1, 64, 64, **options)
        assert not mask.plain, options
        assert auto.choose(q, q, variant=attention.VARIANTS["softmax"], mask=mask, platform="gpu") != "fused", options
    assert not attention.make_mask(1, 32, 64).plain


def test_default_implementation_is_auto():
    """The default is auto's choice on both sides of the CPU's reference size: the reference below it, blockwise
    above it (which differs from the reference in its last bits there, so the comparison can tell them apart)."""
    assert inspect.signature(attention.attend).parameters["implementation"].default == "auto"
    for t, chosen, other in ((16, "reference", "blockwise"), (160, "blockwise", "reference")):
        q, k, v, _ = inputs(key("default", str(t)), 1, t, t, 2, 1, 8)
        mask = attention.make_mask(1, t, t)
        assert auto.choose(q, k, variant=attention.VARIANTS["lssa"], mask=mask, platform="cpu") == chosen
        outs = [
            jit_call(functools.partial(attention.attend, variant="lssa", **options), q, k, v)
            for options in ({}, {"implementation": chosen}, {"implementation": other})
        ]
        default, picked, unpicked = (np.asarray(out) for out in outs)
        np.testing.assert_array_equal(default, picked)
        assert np.any(default != unpicked), t
