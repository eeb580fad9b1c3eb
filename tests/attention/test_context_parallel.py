"""context_parallel_attend equals the reference `attend` (values and gradients) on 8 forced host devices.

Glossary: B batch, T queries, S keys, H heads, K kv heads, D head dim, n the context axis size.
Tolerances and comparison from tests/helpers.py: 1e-4 of the largest reference value for float32
(summation order only), 2e-2 for bfloat16. Each (scenario, variant) is jitted once with a cheap backend compile.
"""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TOLERANCE, assert_close, inputs, jit_call, kernel_operand_widths, key, variant_params, walk_eqns
from jax.sharding import PartitionSpec as P

from freeatten_jax import attention
from freeatten_jax.attention import blockwise, context_parallel, ring_mask

BLOCKS = dict(block_q=4, block_k=4)  # several blocks per device, and blocks straddling zig-zag chunks
ALL = list(attention.VARIANTS)


def _mesh(**axes):
    devices = jax.devices()[: math.prod(axes.values())]
    return jax.make_mesh(tuple(axes.values()), tuple(axes), devices=devices, axis_types=(jax.sharding.AxisType.Auto,) * len(axes))


def _scenario(name):
    """(mesh, sharding axes, q, k, v, cotangent, causal, mask options)."""
    if name == "context4_causal_packed_padded_gqa":  # segments start at 5 and at 16 (a device boundary); row 1's
        q, k, v, g = inputs(key(name), 2, 32, 32, 4, 2, 8)  # segment 1 is all padding: N_i = 0 rows
        segments = jnp.array([[0] * 5 + [1] * 11 + [2] * 16, [0] * 24 + [1] * 8])
        kv_mask = jnp.array([[True] * 30 + [False] * 2, [True] * 24 + [False] * 8])
        return _mesh(context=4), {}, q, k, v, g, True, dict(q_segment_ids=segments, kv_mask=kv_mask)
    if name == "context2_bidirectional_window_positions_mqa":  # shuffled positions, a window, segments split at 12
        q, k, v, g = inputs(key(name), 2, 24, 24, 2, 1, 8)
        positions = jax.random.permutation(jax.random.key(1), 24)
        segments = jnp.array([0] * 12 + [1] * 12)
        options = dict(q_positions=positions, kv_positions=positions, q_segment_ids=segments, window=9)
        return _mesh(context=2), {}, q, k, v, g, False, options
    if name == "context8_kv_cache_offset":  # kv_len > q_len, per-sequence offsets: every query sees the first 30 keys
        q, k, v, g = inputs(key(name), 2, 16, 48, 4, 2, 8)
        return _mesh(context=8), {}, q, k, v, g, True, dict(q_offset=jnp.array([30, 32]))
    if name == "context2_cross_segments_swapped":  # bidirectional, q_len != kv_len: each device's keys are seen
        q, k, v, g = inputs(key(name), 1, 16, 24, 2, 1, 8)  # only by the other device's queries
        segments = dict(q_segment_ids=jnp.array([0] * 8 + [1] * 8), kv_segment_ids=jnp.array([1] * 12 + [0] * 12))
        return _mesh(context=2), {}, q, k, v, g, False, segments
    if name == "data2_context4_replicated_over_data":  # batch_axis None: every data row computes the whole batch
        q, k, v, g = inputs(key(name), 2, 32, 32, 4, 2, 8)
        segments = jnp.array([[0] * 8 + [1] * 24, [0] * 20 + [1] * 12])
        return _mesh(data=2, context=4), {}, q, k, v, g, True, dict(q_segment_ids=segments)
    if name == "data2_context2_tensor2_heads_sharded_bfloat16":  # batch over data, heads over tensor
        q, k, v, g = inputs(key(name), 2, 16, 16, 4, 2, 8, jnp.bfloat16)
        axes = dict(batch_axis="data", head_axis="tensor")
        return _mesh(data=2, context=2, tensor=2), axes, q, k, v, g, True, dict(q_segment_ids=jnp.array([0] * 4 + [1] * 12))
    if name == "context2_narrow_heads_gqa":  # D = 64, 64 tokens a device: the TPU kernels' 32-token blocks pack
        q, k, v, g = inputs(key(name), 2, 128, 128, 4, 2, 64)  # two tokens a 128-lane row; segments, padding
        segments = jnp.array([[0] * 50 + [1] * 78, [0] * 90 + [1] * 38])
        kv_mask = jnp.array([[True] * 128, [True] * 110 + [False] * 18])
        return _mesh(context=2), {}, q, k, v, g, True, dict(q_segment_ids=segments, kv_mask=kv_mask)
    if name == "data2_context4_packed_padded_gqa":  # batch over data; segments cross device boundaries, padding
        q, k, v, g = inputs(key(name), 2, 32, 32, 4, 2, 8)
        segments = jnp.array([[0] * 5 + [1] * 11 + [2] * 16, [0] * 24 + [1] * 8])
        kv_mask = jnp.array([[True] * 30 + [False] * 2, [True] * 20 + [False] * 12])
        axes = dict(batch_axis="data")
        return _mesh(data=2, context=4), axes, q, k, v, g, True, dict(q_segment_ids=segments, kv_mask=kv_mask)
    raise ValueError(name)


# every variant in one of the two richest scenarios, LSSAR (two passes, the most state on the ring) in both
CASES = [
    *[("context4_causal_packed_padded_gqa", variant, "ring") for variant in ("softmax", "ssmax", "lssar", "relu")],
    *[("context2_bidirectional_window_positions_mqa", variant, "ring") for variant in ("lssa", "lssar", "sigmoid")],
    ("context8_kv_cache_offset", "lssar", "ring"),
    ("context2_cross_segments_swapped", "lssa", "ring"),
    ("data2_context4_replicated_over_data", "lssa", "ring"),
    ("data2_context2_tensor2_heads_sharded_bfloat16", "ssmax", "ring"),
    ("context4_causal_packed_padded_gqa", "lssar", "gather"),
    ("context2_bidirectional_window_positions_mqa", "softmax", "gather"),
]


def test_every_variant_runs_on_the_ring_with_segments_and_masks():
    """A variant added to the registry must be added to one of the two scenarios above."""
    assert {variant for scenario, variant, _ in CASES if scenario.startswith("context")} == set(ALL)


def _value_and_grads(attend, q, k, v, g, params):
    """The output and the vjp of g w.r.t. q, k, v and params, jitted once."""

    def value_and_grads(q, k, v, g, params):
        out, vjp = jax.vjp(attend, q, k, v, params)
        return out, vjp(g)

    return jit_call(value_and_grads, q, k, v, g, params)


@pytest.mark.parametrize("scenario, variant, strategy", CASES)
def test_matches_reference(scenario, variant, strategy):
    mesh, axes, q, k, v, g, causal, mask_options = _scenario(scenario)
    params = variant_params(variant, q.shape[2])
    options = dict(variant=variant, causal=causal, **mask_options)
    split = functools.partial(
        context_parallel.context_parallel_attend, mesh=mesh, axis_name="context", strategy=strategy, **axes, **BLOCKS, **options
    )
    whole = functools.partial(attention.attend, implementation="reference", **options)
    (out, grads), (out_ref, grads_ref) = (
        _value_and_grads(lambda q, k, v, p, f=f: f(q, k, v, **p), q, k, v, g, params) for f in (split, whole)
    )
    tolerance = TOLERANCE[q.dtype.type]
    assert out.dtype == q.dtype
    assert_close(out, out_ref, tolerance, "output")
    for name, got, want in zip(["dq", "dk", "dv", "params"], grads, grads_ref):
        for (path, leaf), leaf_ref in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
            assert_close(leaf, leaf_ref, tolerance, f"{name}{jax.tree_util.keystr(path)}")


def _kernel_names(fn, *args) -> set[str]:
    """The names of the Pallas kernels that fn's jaxpr calls (inside shard_map and the ring's loops included)."""
    return set(re.findall(r"name=(freeatten_\w+)", str(jax.make_jaxpr(fn)(*args))))


KERNEL_CASES = [
    # each family of the kernels' rules (rules.FAMILIES; ssmax: softmax's with a scale, in the cache case below)
    *[("data2_context4_packed_padded_gqa", variant, True) for variant in ALL if variant not in ("ssmax", "sigmoid")],
    ("data2_context4_packed_padded_gqa", "lssar", "tpu"),
    ("data2_context4_packed_padded_gqa", "softmax", "tpu"),
    ("context2_bidirectional_window_positions_mqa", "lssar", True),
    ("context8_kv_cache_offset", "ssmax", True),
    ("context2_narrow_heads_gqa", "lssar", "tpu"),
    ("context2_narrow_heads_gqa", "ssmax", "tpu"),
]


@pytest.mark.parametrize("scenario, variant, interpret", KERNEL_CASES)
def test_kernel_ring_matches_reference(scenario, variant, interpret):
    """implementation="pallas": every ring step runs the kernels (interpret mode; True the GPU ones, "tpu" the
    TPU ones), forward passes and backward (dq and dK/dV apart, also for LSSAR), and the result equals the reference,
    values and gradients. A ring step that fell back to the blockwise rules would call no kernel. With D = 64 the
    TPU kernels' q, k, v, accumulators and dK/dV sums are packed two tokens a 128-lane row (none D wide)."""
    mesh, axes, q, k, v, g, causal, mask_options = _scenario(scenario)
    params = variant_params(variant, q.shape[2])
    options = dict(variant=variant, causal=causal, **mask_options)
    split = functools.partial(
        context_parallel.context_parallel_attend, mesh=mesh, axis_name="context", implementation="pallas", **axes, **options
    )
    block = 32 if q.shape[-1] == 64 else 8
    split = functools.partial(split, interpret=interpret, block_q=block, block_k=block)
    whole = functools.partial(attention.attend, implementation="reference", **options)
    attend = lambda q, k, v, p: split(q, k, v, **p)  # noqa: E731
    backward = lambda *a: jax.vjp(attend, *a)[1](g)  # noqa: E731
    names = _kernel_names(backward, q, k, v, params)
    family = attention.get_variant(variant).normalise
    passes = {f"freeatten_{family}_pass{which}" for which in range(2 if family == "reweight" else 1)}
    assert names == passes | {f"freeatten_{family}_dq", f"freeatten_{family}_dkv"}  # the ring never fuses them
    if q.shape[-1] == 64:
        assert kernel_operand_widths(backward, q, k, v, params) == {128}
    (out, grads), (out_ref, grads_ref) = (
        _value_and_grads(lambda q, k, v, p, f=f: f(q, k, v, **p), q, k, v, g, params) for f in (split, whole)
    )
    assert_close(out, out_ref, TOLERANCE[q.dtype.type], "output")
    for name, got, want in zip(["dq", "dk", "dv", "params"], grads, grads_ref):
        for (path, leaf), leaf_ref in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
            assert_close(leaf, leaf_ref, TOLERANCE[q.dtype.type], f"{name}{jax.tree_util.keystr(path)}")


@pytest.mark.parametrize("interpret", [True, "tpu"])
def test_without_a_gradient_the_kernel_ring_carries_only_the_output(interpret):
    """LSSAR round the ring without a gradient: its second pass kernels (the ring's first step, which starts the
    carry itself, and the rest) carry Σ r v and Σ r alone (2 leaves, not the training forward's 4 with y and its row
    sum), and the output is the training forward's to float32 rounding (bit for bit under XLA's default CPU backend;
    the suite's unoptimised backend rounds the two programs' peeled first ring step apart by ~2 eps of the output)."""
    mesh, axes, q, k, v, _, causal, mask_options = _scenario("data2_context4_packed_padded_gqa")
    split = functools.partial(
        context_parallel.context_parallel_attend, mesh=mesh, axis_name="context", implementation="pallas", **axes
    )
    infer = functools.partial(split, variant="lssar", causal=causal, interpret=interpret, block_q=8, block_k=8, **mask_options)
    train = lambda q, k, v: jax.vjp(infer, q, k, v)[0]  # noqa: E731

    def second_pass_outputs(fn):
        eqns = walk_eqns(jax.make_jaxpr(fn)(q, k, v).jaxpr)
        return [len(eqn.outvars) for eqn in eqns if str(eqn.params.get("name")) == "freeatten_reweight_pass1"]

    assert (second_pass_outputs(infer), second_pass_outputs(train)) == ([2, 2], [4, 4])  # the ring's first step, the rest
    out, out_train = jit_call(infer, q, k, v), jit_call(train, q, k, v)
    np.testing.assert_allclose(out, out_train, rtol=0, atol=4 * np.finfo(np.float32).eps * float(np.abs(out_train).max()))


def test_auto_rings_the_kernels_on_accelerators_only():
    """implementation="auto" traces the kernels for CUDA and TPU but lowers the blockwise rules on CPU; "pallas"
    lowers the kernels there too (interpret mode; their names stay in the lowered module's locations)."""
    mesh, axes, q, k, v, g, causal, mask_options = _scenario("data2_context4_packed_padded_gqa")
    split = functools.partial(context_parallel.context_parallel_attend, mesh=mesh, axis_name="context", variant="lssa", **axes)
    lowered = {impl: jax.jit(functools.partial(split, implementation=impl)).lower(q, k, v) for impl in ("auto", "pallas")}
    assert _kernel_names(split, q, k, v) == {"freeatten_sum_pass0"}  # platform_dependent holds every platform's branch
    assert "freeatten_sum_pass0" not in lowered["auto"].as_text(debug_info=True)
    assert "freeatten_sum_pass0" in lowered["pallas"].as_text(debug_info=True)


@pytest.mark.parametrize("variant, extra", [("lssa", {}), ("softmax", {"scale": 0.3})], ids=["lssa", "softmax_scale"])
def test_nan_in_hidden_keys_reaches_nothing(variant, extra):
    """docs/method.md §8: NaN in the keys and values that no query of their batch row sees (padding, whole chunks of
    it on some devices) leaves the output and every gradient finite and equal to the clean reference's.
    Softmax also takes scale= (it must reach variant.prepare, as in attend)."""
    mesh, _, q, k, v, g, causal, mask_options = _scenario("context4_causal_packed_padded_gqa")
    hidden_BS11 = ~mask_options["kv_mask"][:, :, None, None]
    k_nan, v_nan = (jnp.where(hidden_BS11, jnp.nan, x) for x in (k, v))
    options = dict(variant=variant, causal=causal, **mask_options, **extra)
    split = functools.partial(context_parallel.context_parallel_attend, mesh=mesh, axis_name="context", **BLOCKS, **options)
    whole = functools.partial(attention.attend, implementation="reference", **options)
    out, grads = _value_and_grads(lambda q, k, v, p: split(q, k, v), q, k_nan, v_nan, g, {})
    out_ref, grads_ref = _value_and_grads(lambda q, k, v, p: whole(q, k, v), q, k, v, g, {})
    for name, got, want in zip(["output", "dq", "dk", "dv"], (out, *grads[:3]), (out_ref, *grads_ref[:3])):
        assert np.all(np.isfinite(got)), name
        assert_close(got, want, TOLERANCE[q.dtype.type], name)


def _zigzag_round_trip(x_BT, size):
    mesh = _mesh(context=size)
    spec = P(None, "context")

    def local(x_BT):
        zigzag_BT = context_parallel.to_zigzag(x_BT, "context", size)
        return zigzag_BT, context_parallel.from_zigzag(zigzag_BT, "context", size)

    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=(spec, spec), check_vma=False))(x_BT)


def _block_pairs_per_device(t, size, block):
    """How many (query block, key block) pairs each device visits over the ring, causal plain mask."""

    def local(mask):
        mask = jax.tree.map(functools.partial(context_parallel.to_zigzag, axis_name="context", size=size), mask)
        ring = ring_mask.Ring.around(mask, mask.q_positions[:, None], "context", size)  # N_i plays no part here
        plans = [blockwise.make_plan(ring.mask_at(step), ring.n_BHT, block, block, 1) for step in range(size)]
        return sum(jnp.sum(plan.maybe_IJ) for plan in plans)[None]

    shard = jax.shard_map(local, mesh=_mesh(context=size), in_specs=P(None, "context"), out_specs=P("context"), check_vma=False)
    return np.asarray(jax.jit(shard)(attention.make_mask(1, t, t)))


@pytest.mark.parametrize("size", [2, 4, 8])
def test_zigzag_layout_balances_causal_work(size):
    """Device d holds chunks d and 2n-1-d; the round trip is the identity; every device then sees the same
    number of causally visible pairs (Σ_i N_i over its queries) and visits the same number of blocks."""
    t = 4 * size
    zigzag_BT, back_BT = _zigzag_round_trip(jnp.arange(t)[None], size)
    chunks = np.arange(t).reshape(2 * size, 2)
    want = np.concatenate([np.concatenate([chunks[d], chunks[2 * size - 1 - d]]) for d in range(size)])
    np.testing.assert_array_equal(zigzag_BT[0], want)
    np.testing.assert_array_equal(back_BT[0], np.arange(t))
    pairs_per_device = (np.asarray(zigzag_BT[0]) + 1).reshape(size, -1).sum(axis=1)
    assert np.all(pairs_per_device == pairs_per_device[0]), pairs_per_device
    blocks_per_device = _block_pairs_per_device(16 * size, size, 4)
    assert np.all(blocks_per_device == blocks_per_device[0]), blocks_per_device


def test_bad_arguments_raise_one_line_errors():
    q = jnp.zeros((1, 20, 2, 8))
    call = functools.partial(context_parallel.context_parallel_attend, q, q, q, mesh=_mesh(context=4), variant="lssa")
    with pytest.raises(ValueError, match="q_len 20 must be a multiple of 2 x the 'context' axis size"):
        call(axis_name="context")
    with pytest.raises(ValueError, match="not an axis of the mesh"):
        call(axis_name="sequence")
    with pytest.raises(ValueError, match="unknown strategy 'scatter'"):
        call(axis_name="context", strategy="scatter")
    with pytest.raises(ValueError, match="unknown option"):
        call(axis_name="context", block_size=8)
    with pytest.raises(ValueError, match="unknown implementation 'cudnn'"):
        call(axis_name="context", implementation="cudnn")
    with pytest.raises(ValueError, match="interpret must be False, True"):
        call(axis_name="context", interpret="gpu")
    with pytest.raises(ValueError, match="does not support a dense mask"):
        call(axis_name="context", mask=jnp.ones((1, 1, 20, 20), bool))

    with pytest.raises(ValueError, match="unknown attention variant"):
        context_parallel.context_parallel_attend(q, q, q, mesh=_mesh(context=4), axis_name="context", variant="cosine")
