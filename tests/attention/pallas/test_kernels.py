"""The Pallas kernels (interpret mode on the CPU) equal the reference in values and gradients, are as exact
as the reference at bfloat16, hide masked NaN/Inf (docs/method.md §8), and lower to real kernels for TPU
(Mosaic) and CUDA (Triton).

Glossary: B batch, T queries, S keys, H heads, K kv heads, D head dim. Tolerances: float32 inputs
agree to 1e-4 relative (both float32; summation order differs), bfloat16 to 5e-2 relative to the reference
(both round the output and gradients to bfloat16); test_bfloat16_as_exact_as_the_reference holds the
kernels' bfloat16 error within 2x that of the reference itself (FlashAttention's contract).
"""

import contextlib
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    INTERPRET,
    assert_close,
    compare,
    compiled_value_and_grads,
    inputs,
    jit_call,
    kernel_operand_widths,
    key,
    one_per_family,
    value_and_grads,
    variant_params,
    walk_eqns,
)

from freeatten_jax import attention
from freeatten_jax.attention import rules
from freeatten_jax.attention.pallas import gpu
from freeatten_jax.attention.pallas import plan as pallas_plan
from freeatten_jax.attention.pallas.common import BlockSizes, Static, kernel_ctx

TOLERANCE = {jnp.float32: 1e-4, jnp.bfloat16: 5e-2}
PALLAS = dict(implementation="pallas", interpret=INTERPRET, block_q=16, block_k=8)  # several blocks, ragged tails


def scenario(name: str, rng):
    """(q, k, v, cotangent, causal, mask options)."""
    if name == "causal_packed_padded_gqa":  # segments, padding, a fully masked row (N_i = 0), GQA, T = 37
        q, k, v, g = inputs(rng, 2, 37, 37, 4, 2, 16)
        segments = jnp.array([[0] * 20 + [1] * 17, [0] * 9 + [1] * 21 + [2] * 7])
        kv_mask = jnp.array([[True] * 37, [True] * 30 + [False] * 7])  # segment 2 of row 1 sees nothing
        return q, k, v, g, True, dict(q_segment_ids=segments, kv_mask=kv_mask)
    if name == "causal_plain_gqa":  # a plain mask (T == S, default positions): the TPU kernels' folded causal schedule
        q, k, v, g = inputs(rng, 2, 37, 37, 4, 2, 16)
        return q, k, v, g, True, {}
    if name == "bidirectional_window_positions_mqa":  # unsorted positions, S > T, window, padding, MQA
        q, k, v, g = inputs(rng, 2, 23, 41, 4, 1, 16)
        q_positions = jax.random.permutation(jax.random.fold_in(rng, 1), 41)[:23]
        options = dict(q_positions=q_positions, kv_positions=jnp.arange(41), window=15, kv_mask=jnp.arange(41) < 36)
        return q, k, v, g, False, options
    if name == "kv_cache_offset_bfloat16":  # S > T, per-sequence q_offset, bfloat16
        q, k, v, g = inputs(rng, 2, 11, 45, 4, 2, 16, jnp.bfloat16)
        return q, k, v, g, True, dict(q_offset=jnp.array([30, 34]))
    raise ValueError(name)


# The GPU kernels (interpret=True) in every case; the TPU kernels (streamed grid, interpret="tpu") in one case of
# each scenario and, in interpret mode, one variant per family of rules (on a device, where they are fast, every one).
KERNELS = {"gpu": PALLAS, "tpu": dict(PALLAS, interpret="tpu" if INTERPRET else False)}
FAMILIES = one_per_family() if INTERPRET else tuple(attention.VARIANTS)
CASES = [("causal_packed_padded_gqa", variant, "gpu") for variant in attention.VARIANTS]
CASES += [("causal_packed_padded_gqa", variant, "tpu") for variant in FAMILIES]
CASES += [("bidirectional_window_positions_mqa", variant, "gpu") for variant in ("lssa", "lssar")]
CASES += [("kv_cache_offset_bfloat16", variant, "gpu") for variant in ("ssmax", "lssar")]
CASES += [("bidirectional_window_positions_mqa", "lssar", "tpu"), ("kv_cache_offset_bfloat16", "lssar", "tpu")]
CASES += [("causal_plain_gqa", "lssar", "tpu")]


@pytest.mark.parametrize("name, variant, kernels", CASES)
def test_pallas_matches_reference(name, variant, kernels):
    q, k, v, g, causal, mask_options = scenario(name, key(name, variant))
    params = variant_params(variant, q.shape[2])
    compare(q, k, v, g, params, KERNELS[kernels], TOLERANCE[q.dtype.type], variant=variant, causal=causal, **mask_options)


def _narrow_heads(name: str, variant: str, d: int):
    """(q, k, v, cotangent, mask options) of a narrow-head case: segments, padding, a fully masked row and GQA at T = S
    = 77 ("segments"), or a KV cache (S = 90 > T = 40, per-sequence q_offset) in bfloat16 ("cache")."""
    if name == "cache":
        q, k, v, g = inputs(key("lane-packed", name, variant), 2, 40, 90, 4, 2, d, jnp.bfloat16)
        return q, k, v, g, dict(q_offset=jnp.array([50, 44]))
    q, k, v, g = inputs(key("lane-packed", name, variant), 2, 77, 77, 4, 2, d)
    segments = jnp.array([[0] * 40 + [1] * 37, [0] * 19 + [1] * 41 + [2] * 17])
    return q, k, v, g, dict(q_segment_ids=segments, kv_mask=jnp.array([[True] * 77, [True] * 60 + [False] * 17]))


NARROW_CASES = [("segments", "lssar", 64, (32, 32)), ("segments", "softmax", 32, (64, 64)), ("segments", "lssa", 64, (32, 64))]
NARROW_CASES += [("cache", "lssar", 64, (32, 64))]


@pytest.mark.parametrize("name, variant, d, blocks", NARROW_CASES)
def test_the_tpu_kernels_pack_narrow_heads_into_whole_lane_rows(name, variant, d, blocks):
    """With D < 128 the TPU kernels read and write q, k, v, dout, the output (and its bfloat16 low half),
    accumulators and sums packed, 128 // D tokens a 128-lane row (a TPU pads a [.., L, 64] array to 128 lanes in HBM:
    twice its bytes). Segments, padding, a fully masked row, GQA, a KV cache, ragged blocks of 16 packed rows, query
    and key blocks apart (each side packed by its own block): the values and gradients equal the reference's, and
    every such operand of every kernel is 128 wide."""
    q, k, v, g, mask_options = _narrow_heads(name, variant, d)
    options = dict(KERNELS["tpu"], block_q=blocks[0], block_k=blocks[1])
    params = variant_params(variant, q.shape[2])
    grad = jax.grad(lambda q: attention.attend(q, k, v, variant=variant, **options, **mask_options).astype(jnp.float32).sum())
    assert kernel_operand_widths(grad, q) == {128}
    compare(q, k, v, g, params, options, TOLERANCE[q.dtype.type], variant=variant, causal=True, **mask_options)


DKV_CASES = [("causal_packed_padded_gqa", "lssar"), ("bidirectional_window_positions_mqa", "lssa")]
DKV_CASES += [("kv_cache_offset_bfloat16", "lssar")]  # the dK/dV kernel is the same code for every family


@pytest.mark.parametrize("name, variant", DKV_CASES)
def test_a_smaller_dkv_key_block_matches_reference(name, variant):
    """block_k_dkv: the GPU dK/dV kernel runs each 16-key block as two 8-key sub-blocks (a grid twice as long),
    each sweeping its block's query span (segments, padding, a fully masked row, windows, a KV-cache offset, GQA
    and MQA), and the values and gradients still equal the reference's."""
    q, k, v, g, causal, mask_options = scenario(name, key(name, variant, "dkv"))
    params = variant_params(variant, q.shape[2])
    options = dict(PALLAS, block_k=16, block_k_dkv=8)
    grad = jax.grad(lambda q: attention.attend(q, k, v, variant=variant, causal=causal, **options, **mask_options).sum())
    grids = [
        eqn.params["grid_mapping"].grid
        for eqn in walk_eqns(jax.make_jaxpr(grad)(q).jaxpr)
        if str(eqn.params.get("name")).endswith("_dkv")
    ]
    assert grids == [(q.shape[0], k.shape[2], 2 * -(-k.shape[1] // 16))]
    compare(q, k, v, g, params, options, TOLERANCE[q.dtype.type], variant=variant, causal=causal, **mask_options)


def _relative_errors(got, truth):
    """max |got - truth| / max |truth| of the output and of dq, dk, dv."""
    (out, grads), (out_truth, grads_truth) = got, truth
    pairs = zip((out, *grads[:3]), (out_truth, *grads_truth[:3]))
    return np.array([np.max(np.abs(np.float64(a) - np.float64(b))) / np.max(np.abs(np.float64(b))) for a, b in pairs])


BF16_CONTRACT = 2.0  # FlashAttention's: the kernels' bf16 error at most twice the same reference's computed in bf16


def _bf16_errors(variant: str, kernels: dict) -> dict:
    """{name: (the kernels' errors, the reference's own)} at bfloat16 (T = 128, D = 128, GQA, causal, 64 x 64 blocks):
    _relative_errors of each against the reference on the same inputs in float32."""
    q, k, v, g = inputs(key("bf16-error", variant), 1, 128, 128, 2, 1, 128, jnp.bfloat16)
    params = variant_params(variant, 2)
    truth = value_and_grads(
        *(x.astype(jnp.float32) for x in (q, k, v, g)), params, dict(implementation="reference"), variant=variant
    )
    reference = _relative_errors(value_and_grads(q, k, v, g, params, dict(implementation="reference"), variant=variant), truth)
    return {
        name: (
            _relative_errors(value_and_grads(q, k, v, g, params, dict(options, block_q=64, block_k=64), variant=variant), truth),
            reference,
        )
        for name, options in kernels.items()
    }


@pytest.mark.parametrize("variant", attention.VARIANTS)
def test_bfloat16_within_twice_the_reference_error(variant):
    """FlashAttention's precision contract (docs/method.md): at bfloat16 (T = 128, D = 128, GQA, causal) the default
    kernels' output and dq, dk, dv are within 2x the reference's own bfloat16 error, both measured against the
    reference on the same inputs in float32 (whose own error, ~1e-6, is far below bfloat16's ~2e-3); every variant
    with its default kernels, GPU and TPU. The degenerate family holds the same rule (test_degenerate.py)."""
    for name, (errors, reference) in _bf16_errors(variant, KERNELS).items():
        assert np.all(errors <= BF16_CONTRACT * reference), f"{name}: ratios {errors / reference} (out, dq, dk, dv)"


def _causal_static(family: str, blocks: BlockSizes, dtype, split: bool) -> Static:
    """A causal kernel's constants, one query head a kv head, LSSA's key factor, no power: for the row-sum checks."""
    return Static(
        family=family,
        causal=True,
        window=None,
        blocks=blocks,
        kv_groups=1,
        static_power=None,
        weight=None,
        dtype=dtype,
        p_grad=False,
        key_scale=True,
        split=split,
    )


@pytest.mark.parametrize("split, dtype", [(False, jnp.bfloat16), (True, jnp.bfloat16), (False, jnp.float32)])
def test_gpu_kernels_sum_the_weights_as_their_weighted_sum_rounds_them(split, dtype):
    """The GPU kernels' row sums of weights (LSSA's Z, LSSAR's l and Σ ρ^(p-1)) add the weights rounded to the inputs'
    dtype, as the unsplit weighted sum multiplies them (gpu.rounded_row_sum, on the tensor cores); with split matmuls
    or float32 inputs, the float32 weights."""
    cfg = _causal_static("sum", BlockSizes(16, 32), dtype, split)
    ctx = kernel_ctx(cfg, 1.0, 1.0, gpu.family_math(cfg, ptx=False))
    w = jnp.asarray(1 + 2.0**-9 * (1 + np.random.default_rng(1).random((16, 32))), jnp.float32)  # bfloat16 rounds to 1
    sums = np.asarray(ctx.row_sum(w), np.float64)[:, 0]
    rounded = np.asarray(w.astype(jnp.bfloat16), np.float64).sum(axis=1)
    exact = np.asarray(w, np.float64).sum(axis=1)
    np.testing.assert_allclose(sums, rounded if dtype == jnp.bfloat16 and not split else exact, rtol=1e-6)
    assert np.all(rounded == 32) and np.all(exact > 32.06)  # the two differ on every row: the check can fail


def test_gpu_kernels_normalise_lssa_by_the_weights_they_multiply():
    """LSSA's bfloat16 output through the GPU kernels: dividing Σ_j u_ij v_j (u rounded as the matmul takes it) by
    Σ_j of the same rounded u takes its error from 1.85x to 1.46x the reference's own (T = 128, the inputs of
    test_bfloat16_within_twice_the_reference_error)."""
    errors, reference = _bf16_errors("lssa", {"gpu": KERNELS["gpu"]})["gpu"]
    assert errors[0] <= 1.6 * reference[0], errors / reference


OUTPUT_ONLY_PATHS = {
    "blockwise": dict(implementation="blockwise", block_q=16, block_k=8),
    "gpu_kernels": PALLAS,
    "tpu_kernels": {**PALLAS, "interpret": "tpu"},
}


@pytest.mark.parametrize("path", OUTPUT_ONLY_PATHS)
@pytest.mark.parametrize("variant", ["lssa", "lssar"])
def test_without_a_gradient_the_forward_computes_only_the_output(variant, path):
    """Inference (no gradient) runs the forward's output passes alone: the kernels write the output and not the row
    statistics, LSSAR's float32 y or the bfloat16 output's low half that only the backward reads, LSSAR's second
    pass forms no y (fewer matmuls, every path), and the output is the training forward's, bit for bit."""
    q, k, v, _ = inputs(key("output_only", variant, path), 2, 37, 37, 4, 2, 16, jnp.bfloat16)
    infer = lambda q, k, v: attention.attend(q, k, v, variant=variant, **OUTPUT_ONLY_PATHS[path])  # noqa: E731
    train = lambda q, k, v: jax.vjp(infer, q, k, v)[0]  # noqa: E731

    def forward(fn):
        """(outputs of the forward kernel or None, matmuls in the forward) of fn's jaxpr."""
        eqns = list(walk_eqns(jax.make_jaxpr(fn)(q, k, v).jaxpr))
        calls = [eqn for eqn in eqns if eqn.primitive.name == "pallas_call"]
        assert [str(eqn.params["name"]) for eqn in calls] == ([] if path == "blockwise" else [f"freeatten_{family}_fwd"])
        return (len(calls[0].outvars) if calls else None), sum(eqn.primitive.name == "dot_general" for eqn in eqns)

    family = attention.get_variant(variant).normalise
    (outputs, matmuls), (train_outputs, train_matmuls) = forward(infer), forward(train)
    if path != "blockwise":
        assert (outputs, train_outputs) == (1, 2 + len(rules.FAMILIES[family].stats) + len(rules.FAMILIES[family].extras))
    assert matmuls < train_matmuls if variant == "lssar" else matmuls == train_matmuls
    np.testing.assert_array_equal(jit_call(infer, q, k, v), jit_call(train, q, k, v))


@pytest.mark.parametrize("kernels", ["tpu"] if INTERPRET else KERNELS)
def test_lssar_traced_fractional_power(kernels):
    """p as a traced (jit argument), fractional value takes the kernels' non-integer power path: values
    and the gradients of q, k, v and p equal the reference's, on the TPU kernels (and the GPU ones on a device; in
    interpret mode test_kernels_run_per_shard_inside_a_mesh runs them with a traced fractional p)."""
    q, k, v, g, causal, mask_options = scenario("causal_packed_padded_gqa", key("traced-p"))
    compare(q, k, v, g, {"p": jnp.float32(2.5)}, KERNELS[kernels], 1e-4, variant="lssar", causal=causal, **mask_options)


def _context_parallel(q, k, v, **options):
    """context_parallel_attend over 2 host devices (the ring; blockwise on each device unless options say kernels)."""
    mesh = jax.make_mesh((2,), ("context",), devices=jax.devices()[:2], axis_types=(jax.sharding.AxisType.Auto,))
    return attention.context_parallel_attend(q, k, v, mesh=mesh, axis_name="context", block_q=8, block_k=8, **options)


P_PATHS = {  # name: (attend, implementation options)
    "reference": (attention.attend, dict(implementation="reference")),
    "blockwise": (attention.attend, dict(implementation="blockwise", block_q=16, block_k=8)),
    "auto": (attention.attend, dict(implementation="auto")),
    "pallas": (attention.attend, KERNELS["gpu"]),
    "pallas_tpu_kernels": (attention.attend, KERNELS["tpu"]),
    "context_parallel": (_context_parallel, {}),
    "kernel_ring": (_context_parallel, dict(implementation="pallas", interpret=True)),  # the GPU kernels in each ring step
}


@pytest.mark.parametrize("path", P_PATHS)
def test_lssar_power_gradient_matches_finite_differences(path):
    """dL/dp of a learnable LSSAR p (traced) equals the central difference of L (segments, padding, GQA,
    a fully masked row), on every path; never a silent zero. `auto` at T = 32 is the reference on the
    CPU, so a T above its limit is taken for it (blockwise)."""
    t = 160 if path == "auto" else 32
    q, k, v, g = inputs(key("dp", path), 2, t, t, 4, 2, 16)
    segments = jnp.array([[0] * (t - 12) + [1] * 12, [0] * 9 + [1] * (t - 9)])
    options = dict(variant="lssar", q_segment_ids=segments, kv_mask=jnp.array([[True] * t, [True] * (t - 4) + [False] * 4]))
    attend, implementation = P_PATHS[path]
    loss_and_grad = jax.jit(jax.value_and_grad(lambda p: jnp.sum(g * attend(q, k, v, p=p, **options, **implementation))))
    grad = float(loss_and_grad(jnp.float32(3.5))[1])  # one compile serves the slope and the difference's losses
    step = 1e-2
    loss = lambda p: float(loss_and_grad(jnp.float32(p))[0])  # noqa: E731
    difference = (loss(3.5 + step) - loss(3.5 - step)) / (2 * step)
    assert abs(difference) > 0.05  # a real slope, which a zero gradient would miss
    assert abs(grad - difference) <= 1e-2 * abs(difference), (grad, difference)


@pytest.mark.parametrize("variant", ["softmax", "lssar"])
def test_masked_nan_and_inf_never_leak(variant):
    """NaN/Inf in keys and values hidden by padding, causality or segments (an unfilled KV cache, other
    documents) change no visible output and no gradient of a visible input; a row that sees nothing
    outputs zeros (docs/method.md §8)."""
    q, k, v, g = inputs(key("nan", variant), 2, 12, 40, 2, 1, 16)
    options = dict(
        variant=variant,
        kv_mask=jnp.arange(40) < 30,  # slots 30.. are unfilled
        q_offset=jnp.array([17, 0]),  # batch 0: queries at 17..28, so key 29 is causally hidden
        q_segment_ids=jnp.array([[0] * 12, [0] * 5 + [2] * 7]),  # batch 1: queries 5.. see no key (N_i = 0)
        kv_segment_ids=jnp.array([[0] * 40, [0] * 5 + [1] * 35]),  # batch 1: keys 5.. hidden from every query
    )
    dirty_k = k.at[:, 30:].set(jnp.nan).at[0, 29].set(jnp.inf).at[1, 5:30].set(-jnp.inf)
    dirty_v = v.at[:, 30:].set(jnp.inf).at[0, 29].set(jnp.nan).at[1, 5:30].set(jnp.nan)
    run = compiled_value_and_grads(q, k, v, g, {}, PALLAS, **options)
    (out_clean, (dq_clean, dk_clean, dv_clean, _)), (out, (dq, dk, dv, _)) = run(q, k, v, g, {}), run(q, dirty_k, dirty_v, g, {})
    assert_close(out, out_clean, 1e-6, "output")
    assert_close(dq, dq_clean, 1e-6, "dq")
    for b, seen in ((0, 29), (1, 5)):  # the keys some query sees
        assert_close(dk[b, :seen], dk_clean[b, :seen], 1e-6, f"dk, batch {b}")
        assert_close(dv[b, :seen], dv_clean[b, :seen], 1e-6, f"dv, batch {b}")
    np.testing.assert_array_equal(np.asarray(out[1, 5:]), 0.0)


def test_block_skipping_is_conservative():
    """A block pair outside the visiting span never holds a visible pair (random positions, segments,
    padding, window); and something is skipped."""
    rngs = jax.random.split(key("skip"), 4)
    mask = attention.make_mask(
        2,
        50,
        60,
        causal=True,
        q_positions=jax.random.randint(rngs[0], (2, 50), 0, 60),
        q_segment_ids=jnp.sort(jax.random.randint(rngs[1], (2, 50), 0, 4), axis=1),
        kv_segment_ids=jnp.sort(jax.random.randint(rngs[2], (2, 60), 0, 4), axis=1),
        kv_mask=jax.random.bernoulli(rngs[3], 0.8, (2, 60)),
        window=20,
    )
    plan = jit_call(lambda mask: pallas_plan.plan(mask, jnp.zeros((2, 50), jnp.int32), 8, 8), mask)
    visible_BIJ = np.pad(np.asarray(mask.visible()[:, 0]), ((0, 0), (0, 6), (0, 4))).reshape(2, 7, 8, 8, 8).any(axis=(2, 4))
    j_J = np.arange(8)
    in_span = (plan.k_first[:, :, None] <= j_J) & (j_J < plan.k_end[:, :, None])
    in_span_t = (plan.q_first[:, :, None] <= np.arange(7)) & (np.arange(7) < plan.q_end[:, :, None])
    assert not np.any(visible_BIJ & ~np.asarray(in_span))
    assert not np.any(visible_BIJ & ~np.asarray(in_span_t).transpose(0, 2, 1))
    assert not np.all(in_span)


def test_scale_reaches_the_kernels():
    """scale= (instead of 1/sqrt(d)): values and gradients, the scale's own included, equal the
    reference's (which test_masks checks against q * scale * sqrt(d)). One variant per kernel family:
    ssmax's prepare scales through softmax's, and sigmoid shares relu's prepare and kernel. The scale's
    gradient sums ~4,700 products dq'·q of size up to ~80 that cancel to ~1.4 (ssmax): summation order
    alone moves it by 2e-4 relative (blockwise and the kernels agree to 2e-5, the reference differs by
    2e-4), so it is checked to 1e-3."""
    q, k, v, g, causal, mask_options = scenario("causal_packed_padded_gqa", key("scale"))
    for variant in ("ssmax", "sigmoid"):
        params = {**variant_params(variant, q.shape[2]), "scale": jnp.float32(0.7)}
        compare(q, k, v, g, params, PALLAS, 1e-4, params_tolerance=1e-3, variant=variant, causal=causal, **mask_options)


@pytest.mark.parametrize(
    "options, words",
    [
        (dict(block=8), "implementation 'pallas' takes"),
        (dict(mask=jnp.ones((1, 1, 4, 4), bool)), "does not take a dense `mask`"),
        (dict(block_q=0), "block_q must be a positive int"),
        (dict(block_k_dkv=0), "block_k_dkv must be a positive int"),
    ],
)
def test_bad_options_are_refused(options, words):
    q = jnp.zeros((1, 4, 1, 16))
    with pytest.raises(ValueError, match=words):
        attention.attend(q, q, q, variant="lssa", implementation="pallas", **options)


def test_a_dkv_key_block_that_does_not_divide_the_key_block_is_refused():
    q = jnp.zeros((1, 32, 1, 16))
    with pytest.raises(ValueError, match="block_k_dkv=12 must divide the key block length 16"):
        attention.attend(q, q, q, variant="lssa", implementation="pallas", block_k=16, block_k_dkv=12)


KERNEL_CALLS = {"tpu": "tpu_custom_call", "cuda": "__gpu$xla.gpu.triton"}
# Triton lowering reads the target GPU; without one (jax >= 0.11), an abstract H200 stands in.
H200 = jax.sharding.AbstractMesh((1,), ("device",), abstract_device=jax.sharding.AbstractDevice("NVIDIA H200", None, "gpu"))
TARGETS = {"tpu": contextlib.nullcontext, "cuda": functools.partial(jax.sharding.use_abstract_mesh, H200)}


@pytest.mark.parametrize("variant", ["lssa", "lssar"])
def test_lowers_to_tpu_and_cuda_kernels(variant):
    """Forward+backward at bfloat16, T = 4096, D = 128 lowers for TPU (Mosaic) and CUDA (Triton) to the
    kernels as custom calls, chosen by platform_dependent, without any [T, S] score tensor in the surrounding XLA:
    forward, dq and dkv."""
    shape = jax.ShapeDtypeStruct((1, 4096, 2, 128), jnp.bfloat16)

    def loss(q, k, v):
        return jnp.sum(attention.attend(q, k, v, variant=variant, implementation="pallas").astype(jnp.float32))

    for platform, call in KERNEL_CALLS.items():
        with TARGETS[platform]():
            traced = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).trace(shape, shape, shape)
            text = traced.lower(lowering_platforms=(platform,)).as_text()
        kernels = {"fwd", "dq", "dkv"}
        assert text.count(f"custom_call @{call}") == len(kernels), platform
        assert set(re.findall(r"freeatten_\w+_(fwd|dq|dkv)\b", text)) == kernels, platform
        assert not any(other in text for other in set(KERNEL_CALLS.values()) - {call}), platform
        assert "4096x4096" not in text, platform


def test_without_interpret_option_the_platform_decides():
    """Without interpret=True, platform_dependent picks the lowering (interpret mode on the CPU); values
    and gradients through it equal the reference's."""
    q, k, v, g = inputs(key("platform"), 1, 20, 20, 2, 1, 16)
    compare(q, k, v, g, {}, dict(implementation="pallas"), 1e-4, variant="lssa")


def test_auto_decides_per_platform_and_never_picks_pallas():
    """auto under cross-lowering: float32 softmax at T = 1024 is blockwise on the CPU (a while loop over
    blocks, no [T, S] tensor) and the reference on CUDA and TPU (a [T, S] tensor, no loop), decided by
    platform_dependent rather than by the machine that lowers; no Pallas kernel in any."""
    shape = jax.ShapeDtypeStruct((1, 1024, 1, 16), jnp.float32)
    traced = jax.jit(functools.partial(attention.attend, variant="softmax")).trace(shape, shape, shape)
    for platform, picked in {"cpu": "blockwise", "cuda": "reference", "tpu": "reference"}.items():
        text = traced.lower(lowering_platforms=(platform,)).as_text()
        assert ("1024x1024" in text, "stablehlo.while" in text) == (picked == "reference", picked == "blockwise"), platform
        assert "freeatten_" not in text and "custom_call" not in text, platform


def _pallas_calls(jaxpr, inside=False):
    """(eqn, whether it sits inside a shard_map) for every pallas_call in a jaxpr, nested ones included."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            yield eqn, inside
        for sub in jax.core.jaxprs_in_params(eqn.params):
            yield from _pallas_calls(sub, inside or eqn.primitive.name == "shard_map")


def _q_shape(eqn):
    """The shape of a kernel's q operand: its first 4-D argument (after the span and p arrays)."""
    return next(x.aval.shape for x in eqn.invars if x.aval.ndim == 4)


def test_kernels_run_per_shard_inside_a_mesh():
    """Under an ambient mesh of 8 host devices (data 2, fsdp 2, tensor 2), every kernel (LSSAR's forward, dq and
    dK/dV) runs inside shard_map on its shard (batch / 4, heads / 2), and values and gradients equal the unsharded
    reference's."""
    q, k, v, g, causal, mask_options = scenario("causal_packed_padded_gqa", key("mesh"))
    q, k, v, g = (jnp.concatenate([x, x[::-1] * 0.5]) for x in (q, k, v, g))  # batch 4
    mask_options = {name: jnp.concatenate([x, x[::-1]]) for name, x in mask_options.items()}
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
    with jax.set_mesh(mesh):
        run = functools.partial(attention.attend, variant="lssar", causal=causal, **mask_options, **PALLAS)
        jaxpr = jax.make_jaxpr(lambda q, k, v, g: jax.vjp(run, q, k, v)[1](g))(q, k, v, g)
        calls = list(_pallas_calls(jaxpr.jaxpr))
        assert sorted(eqn.params["name"] for eqn, _ in calls) == [f"freeatten_reweight_{x}" for x in ("dkv", "dq", "fwd")]
        for eqn, inside in calls:
            assert inside, eqn.params["name"]
            assert _q_shape(eqn)[:2] == (1, 2), eqn.params["name"]  # q: [B / 4, H / 2, Tp, D]
        # a traced p: its gradient sums every device's share
        compare(q, k, v, g, {"p": jnp.float32(3.5)}, PALLAS, 1e-4, variant="lssar", causal=causal, **mask_options)


def test_layer_runs_kernels_per_shard_under_use_mesh():
    """The NNX layer with implementation="pallas" under sharding.use_mesh (data 2, fsdp 2, tensor 2)
    needs no shard_map of its own: its kernels run inside one, and its output equals the reference's."""
    from flax import nnx

    from freeatten_jax.nn import sharding
    from freeatten_jax.nn.attention_layer import Attention

    layer = Attention(
        32,
        4,
        num_kv_heads=2,
        variant="lssa",
        rngs=nnx.Rngs(0),
        implementation="pallas",
        implementation_options=dict(interpret=INTERPRET, block_q=8, block_k=8),
    )
    x_BTE = jax.random.normal(key("layer-mesh"), (4, 20, 32))
    with sharding.use_mesh(sharding.make_mesh((2, 2, 2)), sharding.DEFAULT_RULES):
        jaxpr = jax.make_jaxpr(lambda x: layer(x))(x_BTE)
        calls = list(_pallas_calls(jaxpr.jaxpr))
        assert calls and all(inside and _q_shape(eqn)[:2] == (1, 2) for eqn, inside in calls)
        out = jax.jit(lambda x: layer(x))(x_BTE)
    layer.set_implementation("reference")
    assert_close(out, layer(x_BTE), 1e-4, "output")


@pytest.mark.parametrize("split", [False, True])
def test_split_matmuls_split_the_weights_but_never_lssars_y(split):
    """With split_matmuls the weights enter their matmul as two bfloat16 halves (exact to ~2^-17); LSSAR's y
    (pv_once) is always rounded once, as the reference's is, whatever the option."""
    rng = np.random.default_rng(0)
    w, x = jnp.asarray(rng.random((16, 32)), jnp.float32), jnp.asarray(rng.normal(size=(32, 16)), jnp.bfloat16)
    acc = jnp.zeros((16, 16), jnp.float32)
    ctx = kernel_ctx(
        _causal_static("reweight", BlockSizes(16, 16), jnp.bfloat16, split),
        1.0,
        2.0,
    )
    once = np.asarray(jnp.dot(w.astype(jnp.bfloat16), x, preferred_element_type=jnp.float32))
    exact = np.asarray(w) @ np.asarray(x, np.float32)
    np.testing.assert_array_equal(np.asarray(ctx.pv_once(w, x, acc)), once)
    error = np.abs(np.asarray(ctx.pv(w, x, acc)) - exact).max()
    assert (error < 1e-4 * np.abs(exact).max()) if split else np.array_equal(np.asarray(ctx.pv(w, x, acc)), once)
