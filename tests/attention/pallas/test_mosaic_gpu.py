"""The Mosaic GPU forward (pallas/mosaic_gpu.py) in GPU interpret mode on the CPU, with gpu.py's backward: values and
gradients against the reference under the 2x contract, its statistics against the Triton forward's, race detection,
what it refuses, and a deviceless compile for the H100 with no spills.

Glossary: B batch, T queries = S keys, H heads, K kv heads, D head dim. Interpret mode is slow (10-30 s a call on two
cores): each case is one small call, under a watchdog that ends the process with a traceback if it hangs (an
exception inside a simulated warpgroup can leave the others waiting on a barrier).
"""

import ast
import faulthandler
import inspect
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import inputs, key, value_and_grads

from freeatten_jax import attention
from freeatten_jax.attention import arguments, rules
from freeatten_jax.attention.block_plan import count_visible
from freeatten_jax.attention.pallas import core, mosaic_gpu, plan

WATCHDOG_S = 300
MOSAIC = dict(implementation="pallas", interpret=True, gpu_kernels="mosaic_gpu")
REFERENCE = dict(implementation="reference")


@pytest.fixture(autouse=True)
def watchdog():
    """Every test under a timeout that holds even while the main thread waits inside a kernel."""
    from jax._src.pallas.mosaic_gpu.interpret.interpret_pallas_call import reset_gpu_interpret_mode_state

    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    try:
        yield
    except BaseException:
        reset_gpu_interpret_mode_state()
        raise
    finally:
        faulthandler.cancel_dump_traceback_later()


def _flat_rows(x, b):
    return np.asarray(x, np.float64).reshape(b, -1)


def assert_within_twice_the_reference_error(got, reference, truth, what, scale=None):
    """The 2x contract (tests/attention/test_degenerate.py): per batch row, |got - truth| at most twice the bfloat16
    reference's own error, floored at one bfloat16 rounding (2^-9) of the row's scale (default: its largest |truth|)."""
    b = truth.shape[0]
    got, reference, truth = (_flat_rows(x, b) for x in (got, reference, truth))
    assert np.all(np.isfinite(got)), what
    scale = np.abs(truth).max(axis=1) if scale is None else scale
    limit = 2.0 * np.maximum(np.abs(reference - truth).max(axis=1), 2.0**-9 * scale)
    error = np.abs(got - truth).max(axis=1)
    assert np.all(error <= limit), f"{what}: errors {error} > limits {limit}"


def _contract(q, k, v, causal, *, block_k=None, grads=False, g=None, **options):
    """Mosaic's output (and dq, dk, dv) on bfloat16 inputs within 2x the bfloat16 reference's error of float32's."""
    low = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    mosaic = dict(MOSAIC, block_k=block_k)
    if not grads:
        run = lambda impl, *x: attention.attend(*x, variant="lssa", causal=causal, **impl, **options)  # noqa: E731
        got, ref, truth = run(mosaic, *low), run(REFERENCE, *low), run(REFERENCE, q, k, v)
        assert got.dtype == jnp.bfloat16
        assert_within_twice_the_reference_error(got, ref, truth, "output")
        return
    both = lambda impl, *x: value_and_grads(*x, {}, impl, variant="lssa", causal=causal, **options)  # noqa: E731
    got, ref = both(mosaic, *low, g.astype(jnp.bfloat16)), both(REFERENCE, *low, g.astype(jnp.bfloat16))
    truth = both(REFERENCE, q, k, v, g)
    assert_within_twice_the_reference_error(got[0], ref[0], truth[0], "output")
    b = q.shape[0]
    scale = np.max([np.abs(_flat_rows(x, b)).max(axis=1) for x in truth[1][:3]], axis=0)
    for name, x, r, t in zip(("dq", "dk", "dv"), got[1][:3], ref[1][:3], truth[1][:3]):
        assert_within_twice_the_reference_error(x, r, t, name, scale)


def test_causal_gqa_values_and_gradients_through_the_triton_backward():
    """Causal, 2 heads on 1 kv head, T = 128 in 64-key blocks (the second warpgroup visits an interior and a diagonal
    block, the first flushes one): output and dq, dk, dv, the backward gpu.py's on Mosaic's statistics."""
    q, k, v, g = inputs(key("mosaic", "gqa"), 1, 128, 128, 2, 1, 64)
    _contract(q, k, v, True, grads=True, g=g, block_k=64)


def test_block_edges_non_causal_padded_keys_and_queries():
    """T = 100 in 128-key blocks, non-causal: padded keys masked, padded query rows dropped."""
    q, k, v, _ = inputs(key("mosaic", "edges"), 1, 100, 100, 1, 1, 64)
    _contract(q, k, v, False, block_k=128)


def test_degenerate_rows():
    """Batch rows: q = 0 (uniform weights), identical keys, tiny q, one dominant key; then a huge temperature (scores
    ~290: softplus is the score itself, 2^-|s| underflows) and a near-zero one (scores ~4e-4: near-uniform rows)."""
    t, d = 64, 64
    q, k, v, _ = inputs(key("mosaic", "degenerate"), 4, t, t, 1, 1, d)
    direction = jax.random.normal(key("mosaic", "direction"), (d,))
    q = q.at[0].set(0.0).at[2].multiply(1e-4).at[3].set(3.0 * direction + 0.3 * q[3])
    k = k.at[1].set(k[1, :1]).at[3, 7].set(20.0 * direction)
    _contract(q, k, v, True)
    _contract(q[2:], k[2:], v[2:], True, temperature_length=1e30)
    _contract(q[2:], k[2:], v[2:], True, temperature_length=1.0001)


def test_degree_4_log_is_within_its_bound_for_16_bit_weights():
    """The kernel's log2(1 + t), rules.LOG2_1P_4 in float32 Horner, within 6e-5 relative of float64 for t in [0, 1]
    (tiny t included): 32x below bfloat16's half-ulp, 8x below float16's (2^-9, 2^-11), the only dtypes it takes."""
    t = np.concatenate([np.geomspace(1e-37, 1.0, 4000), np.linspace(0.0, 1.0, 4001)]).astype(np.float32)
    got = np.asarray(jax.jit(lambda t: rules.log2_1p(t, coeffs=rules.LOG2_1P_4))(t), np.float64)
    error = np.abs(got / np.maximum(np.log1p(np.float64(t)) / np.log(2), 1e-300) - 1)[t > 0]
    assert error.max() < 6e-5 and 6e-5 * 8 < 2.0**-11
    assert set(mosaic_gpu.DTYPES) == {jnp.bfloat16, jnp.float16}


def _kernel_forward(lowering, q, k, v, causal, run_with=None):
    """A lowering's forward kernel on LSSA's operands, as core.single_device_core calls it: (out, z, low half);
    run_with(cfg, shapes) gives the forward call instead of the lowering's own."""
    t, d = q.shape[1], q.shape[-1]
    variant, mask, opts, _ = arguments.parse(q, k, v, "lssa", causal, {})
    n_B1T, _ = count_visible(mask, 512)
    cfg, (q, k, v, qs, ks, p_1) = core.kernel_arguments(variant, mask, opts, q, k, v, n_B1T)
    cfg = core.sized(lowering, cfg, (64, 64, None), t, t, d)._replace(plain_length=t)
    operands, shapes = core.kernel_layout(cfg, q, k, v, qs, ks)
    forward = (run_with or (lambda cfg, shapes: lowering.calls(cfg, shapes)[0]))(cfg, shapes)
    return forward(*core.kernel_inputs(plan.plan(mask, n_B1T[:, 0], 64, 64), p_1, *operands))


def test_statistics_match_the_triton_forward_without_races():
    """Z, the output and its low half as the Triton forward writes them (its backward reads them), causal GQA, with
    the interpreter's race detection on; equal up to the logs: Mosaic's degree-4 polynomial (5.7e-5 off Triton's
    degree 7) moves a few weights across a bfloat16 rounding, within one rounding (2^-9) of Z and of the output."""
    from jax._src.pallas.mosaic_gpu.interpret.interpret_pallas_call import get_races
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    q, k, v, _ = inputs(key("mosaic", "stats"), 1, 128, 128, 2, 1, 64, jnp.bfloat16)
    racing = lambda cfg, shapes: mosaic_gpu.forward_call(cfg, shapes, InterpretGPUParams(detect_races=True))  # noqa: E731
    out, z, low = _kernel_forward(core.LOWERINGS["interpret_mosaic_gpu"], q, k, v, True, racing)
    assert not get_races().races_found
    out_t, z_t, low_t = _kernel_forward(core.LOWERINGS["interpret"], q, k, v, True)
    assert z.shape == z_t.shape and low.shape == low_t.shape
    np.testing.assert_allclose(np.asarray(z), np.asarray(z_t), rtol=2.0**-9)
    whole, whole_t = (np.asarray(a, np.float32) + np.asarray(b, np.float32) for a, b in ((out, low), (out_t, low_t)))
    np.testing.assert_allclose(whole, whole_t, rtol=0, atol=2.0**-9 * np.abs(whole_t).max())


@pytest.mark.parametrize(
    "case, options",
    [
        ("float32", dict(dtype=jnp.float32)),
        ("softmax", dict(variant="softmax")),
        ("segments", dict(q_segment_ids=jnp.zeros((1, 256), jnp.int32).at[:, 128:].set(1))),
        ("head dim 32", dict(d=32)),
        ("block_q 128", dict(block_q=128)),
    ],
)
def test_refuses_what_it_does_not_run(case, options):
    """One ValueError naming the reason, raised while tracing (no kernel runs)."""
    options = dict(options)
    dtype, d, variant = options.pop("dtype", jnp.bfloat16), options.pop("d", 64), options.pop("variant", "lssa")
    q, k, v, _ = inputs(key("mosaic", "refuse"), 1, 256, 256, 1, 1, d, dtype)
    with pytest.raises(ValueError, match="Mosaic GPU kernels do not take"):
        jax.eval_shape(lambda q, k, v: attention.attend(q, k, v, variant=variant, **MOSAIC, **options), q, k, v)


def test_refuses_an_unknown_gpu_kernels_value():
    q, k, v, _ = inputs(key("mosaic", "refuse"), 1, 64, 64, 1, 1, 64)
    with pytest.raises(ValueError, match="gpu_kernels must be one of"):
        attention.attend(q, k, v, variant="lssa", implementation="pallas", gpu_kernels="cutlass")


def test_interpret_switches_are_the_only_difference():
    """Every branch on `interpret` in the kernel module sits in one of its named interpret switches."""
    tree = ast.parse(inspect.getsource(mosaic_gpu))
    switches = {"_laid_out", "_load", "_iota", "_keys_in_hbm", "_key_tile", "_key_smem_shape", "_keys_transposed"}
    switches |= {"_weights_operand", "_rounded", "_accumulate", "_scratch", "_interpret_params", "forward_call"}
    branching = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.If, ast.IfExp)) and "interpret" in ast.unparse(inner.test):
                    branching.add(node.name)
    assert branching and branching <= switches, branching - switches


def test_compiles_for_the_h100_as_a_mosaic_call_without_spills(tmp_path, monkeypatch):
    """Deviceless: attend lowers to one mosaic_gpu custom call, and ptxas (the [compile] extra's nvidia-cuda-nvcc)
    assembles it for sm_90a with no spill bytes, D = 64 and 128."""
    from jax._src import lib

    from freeatten_jax.compile import targets

    ptxas = os.path.join(lib.cuda_path or "/usr/local/cuda", "bin", "ptxas")
    assert os.path.exists(ptxas), f"no ptxas at {ptxas}: install the [compile] extra (nvidia-cuda-nvcc)"
    mesh = jax.sharding.Mesh(targets.devices("h100")[:1], ("device",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    fn = lambda q, k, v: attention.attend(q, k, v, variant="lssa", implementation="pallas", gpu_kernels="mosaic_gpu")  # noqa: E731
    for d in (64, 128):
        dump = tmp_path / f"d{d}"
        dump.mkdir()
        monkeypatch.setenv("MOSAIC_GPU_DUMP_TO", str(dump))
        q, kv = (jax.ShapeDtypeStruct((1, 256, h, d), jnp.bfloat16, sharding=replicated) for h in (2, 1))
        with jax.set_mesh(mesh):
            lowered = jax.jit(fn).lower(q, kv, kv)
            assert lowered.as_text().count("custom_call @mosaic_gpu") == 1
            lowered.compile()
        (log,) = dump.glob("*.ptxas")
        text = log.read_text()
        assert "sm_90a" in text
        assert re.search(r"0 bytes spill stores, 0 bytes spill loads", text), text
