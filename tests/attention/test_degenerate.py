"""Rare inputs on every path: rows where attention is exactly or nearly uniform, one dominant key,
a single visible key, rows that see nothing and huge logits, each a batch row of one input. Values are held
to the float64 oracle (tests/attention_oracle.py) batch row by batch row, gradients to the reference's.

Glossary: B batch (one degenerate case per row), T queries = S keys, H heads, K kv heads, D head dim.
Before the one-threshold rule for LSSAR's re-weighting (rules.py), blockwise, the ring and both kernels
returned all-zero rows in the q = 0 and identical-keys cases.
"""

import functools

import attention_oracle as oracle
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import INTERPRET, key, one_per_family, value_and_grads, variant_params

from freeatten_jax import attention
from freeatten_jax.attention import rules

B, T, H, K, D = 6, 48, 2, 1, 16
CASES = ("q = 0", "identical keys", "tiny q (1e-4)", "one dominant key", "huge logits", "single visible key, masked rows")
SEGMENTS = np.array([0] * 20 + [1] * 20 + [2] * 8)  # query 20 sees one key; segment 2 is all padding
KV_VALID = np.arange(T) < 40  # so queries 40.. see nothing (N_i = 0)


def degenerate_inputs():
    """q, k, v, cotangent [B, T, ...] float32 (batch row b is CASES[b]) and the mask options."""
    shapes = [(B, T, H, D), (B, T, K, D), (B, T, K, D), (B, T, H, D)]
    q, k, v, g = (jax.random.normal(x, shape) for x, shape in zip(jax.random.split(key("degenerate"), 4), shapes))
    direction = jax.random.normal(key("direction"), (D,))
    q = q.at[0].set(0.0)
    k = k.at[1].set(k[1, :1])
    q = q.at[2].multiply(1e-4)
    q = q.at[3].set(3.0 * direction + 0.3 * q[3])
    k = k.at[3, 7].set(20.0 * direction)
    q, k = q.at[4].multiply(10.0), k.at[4].multiply(10.0)  # softmax logits up to ~400: e^88 already overflows float32
    segments = np.stack([np.zeros(T, int)] * 5 + [SEGMENTS])
    kv_valid = np.stack([np.ones(T, bool)] * 5 + [KV_VALID])
    return q, k, v, g, dict(q_segment_ids=jnp.asarray(segments), kv_mask=jnp.asarray(kv_valid))


def _context_parallel(q, k, v, **options):
    """context_parallel_attend over 2 host devices (the ring; its rules on each device unless `options` name kernels)."""
    mesh = jax.make_mesh((2,), ("context",), devices=jax.devices()[:2], axis_types=(jax.sharding.AxisType.Auto,))
    return attention.context_parallel_attend(q, k, v, mesh=mesh, axis_name="context", block_q=8, block_k=8, **options)


KERNEL_BLOCKS = dict(implementation="pallas", block_q=16, block_k=8)  # several blocks: interior and edge paths
PATHS = {  # name: (attend, implementation options)
    "reference": (attention.attend, dict(implementation="reference")),
    "blockwise": (attention.attend, dict(implementation="blockwise", block_q=16, block_k=8)),
    "pallas": (attention.attend, dict(KERNEL_BLOCKS, interpret=INTERPRET)),
    "pallas_tpu_kernels": (attention.attend, dict(KERNEL_BLOCKS, interpret="tpu" if INTERPRET else False)),
    "context_parallel": (_context_parallel, {}),
    "context_parallel_kernels": (_context_parallel, dict(implementation="pallas", interpret=INTERPRET)),
}
# The reference meets the oracle in every variant, each fast path in one variant per family of rules; the kernel
# ring on the variant whose rows the ring once lost (q = 0, identical keys).
PATH_VARIANTS = {"reference": tuple(attention.VARIANTS), "context_parallel_kernels": ("lssar",)}
CASES_BY_PATH = [(variant, path) for path in PATHS for variant in PATH_VARIANTS.get(path, one_per_family())]


def assert_rows_close(got, want, tolerance, what, scale_B=None):
    """Finite, and within tolerance x the scale of each batch row: by default the largest |want| of the row (at
    least 1e-3), so that one case's size (huge logits) does not hide another's error."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.all(np.isfinite(got)), what
    for b, case in enumerate(CASES):
        error = np.max(np.abs(got[b] - want[b]))
        scale = max(np.max(np.abs(want[b])), 1e-3) if scale_B is None else scale_B[b]
        assert error <= tolerance * scale, f"{what}, {case}: max error {error:.3g} vs scale {scale:.3g}"


@functools.cache
def _oracle_output(variant):
    q, k, v, _, options = degenerate_inputs()
    positions = np.broadcast_to(np.arange(T), (B, T))
    segments, valid = np.asarray(options["q_segment_ids"]), np.asarray(options["kv_mask"])
    m = oracle.visible(positions, positions, segments, segments, valid, causal=True)
    params = {name: np.asarray(x) for name, x in variant_params(variant, H).items()}
    return oracle.attend(np.asarray(q), np.asarray(k), np.asarray(v), m, variant, **params)


@functools.cache
def _reference_grads(variant):
    """dq, dk, dv (and the params') of the reference on degenerate_inputs, once per process and variant."""
    q, k, v, g, options = degenerate_inputs()
    return value_and_grads(q, k, v, g, variant_params(variant, H), PATHS["reference"][1], variant=variant, **options)[1]


@pytest.mark.parametrize("variant, path", CASES_BY_PATH)
def test_degenerate_rows_match_the_oracle(variant, path):
    """Output equals the float64 oracle's in every case, gradients the reference's (float32 both sides), each
    batch row's dq, dk and dv to the tolerance times the largest of them: with identical keys the true dq is 0,
    left by the cancellation of terms of the size of dk's (Σ_j ds_ij k_j with Σ_j ds_ij = 0)."""
    q, k, v, g, options = degenerate_inputs()
    params = variant_params(variant, H)
    attend, implementation = PATHS[path]
    out, grads = value_and_grads(q, k, v, g, params, implementation, attend, variant=variant, **options)
    assert_rows_close(out, _oracle_output(variant), 1e-4, "output")
    np.testing.assert_array_equal(np.asarray(out[5, 40:]), 0.0)  # rows that see nothing are zero
    if path != "reference":
        grads_ref = _reference_grads(variant)
        scale_B = np.max([np.abs(np.asarray(x)).reshape(B, -1).max(axis=1) for x in grads_ref[:3]], axis=0)
        for name, got, want in zip(("dq", "dk", "dv"), grads, grads_ref):
            assert_rows_close(got, want, 1e-4, name, scale_B)


def test_base_2_softplus_and_sigmoid_are_exact_over_the_float32_range():
    """The kernels' log2(1 + t), a polynomial, within 4e-7 relative of float64 for t in [0, 1] (tiny t
    included; the TPU kernels' hardware log with a series for small t within 4e-6); softplus in base 2 and
    sigmoid within 1e-5 from scores where 2^s2 underflows to far above (the rest is exp2's own error, a few ulp
    of its argument at the extremes on the CPU), also with an exp2 that flushes results below 2^-126 to 0 (the GPU
    kernels')."""
    t = np.concatenate([np.geomspace(1e-37, 1.0, 4000), np.linspace(0.0, 1.0, 4001)]).astype(np.float32)
    log2_1p = np.asarray(jax.jit(rules.log2_1p)(t), np.float64)
    np.testing.assert_allclose(log2_1p, np.log1p(np.float64(t)) / np.log(2), rtol=4e-7, atol=0)
    eup = np.asarray(jax.jit(rules.log2_1p_eup)(t), np.float64)  # the TPU kernels': the hardware log and a series
    np.testing.assert_allclose(eup, np.log1p(np.float64(t)) / np.log(2), rtol=4e-6, atol=0)
    s2 = np.concatenate([-np.geomspace(1e-8, 125, 4000), [0.0], np.geomspace(1e-8, 1e4, 4000)]).astype(np.float32)
    s = np.float64(s2)
    flushing = lambda x: jnp.where(x < -126.0, 0.0, jnp.exp2(x))  # noqa: E731  the GPU kernels' ex2.approx.ftz
    for exp2 in (jnp.exp2, flushing):
        fn = functools.partial(rules.softplus_and_sigmoid, exp2=exp2)
        softplus2, sigmoid = (np.asarray(x, np.float64) for x in jax.jit(fn)(s2))
        np.testing.assert_allclose(softplus2, np.logaddexp(0.0, s * np.log(2)) / np.log(2), rtol=1e-5, atol=0)
        np.testing.assert_allclose(sigmoid, 1 / (1 + np.exp2(-s)), rtol=1e-5, atol=0)
        below = -np.geomspace(126.5, 1e4, 100).astype(np.float32)  # t underflows: softplus within 2^-126 of 0
        softplus2, sigmoid = (np.asarray(x, np.float64) for x in jax.jit(fn)(below))
        assert np.all((softplus2 >= 0) & (softplus2 <= 2.0**-126)) and np.all((sigmoid >= 0) & (sigmoid <= 2.0**-126))


BF16_PATHS = ("blockwise", "pallas", "pallas_tpu_kernels")


@pytest.mark.parametrize("path", BF16_PATHS)
@pytest.mark.parametrize("variant", one_per_family())
def test_degenerate_rows_in_bfloat16_within_twice_the_reference_error(variant, path):
    """FlashAttention's precision contract on the rare inputs: in bfloat16, each case's (batch row's) output and
    dq, dk, dv errors against the float32 reference are at most 2x the reference's own bfloat16 errors, floored at
    one bfloat16 rounding of the row's scale (the output's largest |value|; for the gradients the largest of dq, dk
    and dv, as above: identical keys leave dq = 0 by a cancellation that the reference's float32 ds keeps exact)."""
    q, k, v, g, options = degenerate_inputs()
    params = variant_params(variant, H)
    truth = value_and_grads(q, k, v, g, params, PATHS["reference"][1], variant=variant, **options)
    low = [x.astype(jnp.bfloat16) for x in (q, k, v, g)]
    reference = value_and_grads(*low, params, PATHS["reference"][1], variant=variant, **options)
    got = value_and_grads(*low, params, PATHS[path][1], PATHS[path][0], variant=variant, **options)
    flat = lambda result: [np.asarray(x, np.float64).reshape(B, -1) for x in (result[0], *result[1][:3])]  # noqa: E731
    scales = [np.abs(x).max(axis=1) for x in flat(truth)]
    scales = [scales[0]] + [np.max(scales[1:], axis=0)] * 3
    for name, x, ref, want, scale in zip(("output", "dq", "dk", "dv"), flat(got), flat(reference), flat(truth), scales):
        floor = 2.0**-9 * scale
        limit = 2.0 * np.maximum(np.abs(ref - want).max(axis=1), floor)
        error = np.abs(x - want).max(axis=1)
        bad = [f"{case}: {e:.3g} > {lim:.3g}" for case, e, lim in zip(CASES, error, limit) if not e <= lim]
        assert not bad, f"{name}: {bad}"
