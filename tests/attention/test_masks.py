"""Explicit dense masks (values and gradients), per-head N_i, `scale`, and masked NaN/Inf (docs/method.md §8).

Glossary: B batch, T queries, S keys, H heads, K kv heads, D head dim. Every comparison runs on the
reference and the blockwise path (small blocks, so masks and padding fall on block edges).
"""

import functools

import attention_oracle as oracle
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_close, inputs, jit_call, key, variant_params

from freeatten_jax import attention
from freeatten_jax.attention import block_plan, blockwise

VARIANTS = list(attention.VARIANTS)
IMPLEMENTATIONS = {"reference": {}, "blockwise": dict(block_q=8, block_k=8)}


def _vjp(fn, q, k, v, g):
    """fn's output and its q, k, v gradients for the cotangent g."""
    out, vjp = jax.vjp(fn, q, k, v)
    return out, vjp(g)


def _check_same(got, want, tolerance=1e-4, what=""):
    for name, x, y in zip(["out", "dq", "dk", "dv"], [got[0], *got[1]], [want[0], *want[1]]):
        assert_close(x, y, tolerance, f"{what} {name}")


# (b, t, s, h, kv_heads, causal, structured options): edges of segments, padding, windows and
# offsets fall on the 8-wide blocks; the last query of row 1 in the second case sees nothing.
STRUCTURED = {
    "packed_padded_gqa": (
        2,
        19,
        19,
        4,
        2,
        True,
        dict(q_segment_ids=jnp.array([[0] * 8 + [1] * 11, [0] * 16 + [1] * 3]), kv_mask=jnp.arange(19) < 16),
    ),
    "bidirectional_offset_window_padding": (
        2,
        9,
        24,
        2,
        1,
        False,
        dict(q_offset=jnp.array([8, 15]), window=8, kv_mask=jnp.arange(24) < 16),
    ),
}


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_dense_mask_equals_structured_mask(variant, implementation):
    """The structured mask given as a dense [B, 1, T, S] mask (causal off) gives the same values and
    gradients; the dense path runs on `implementation`, the structured one on the reference."""
    cases = [inputs(key(variant, name), b, t, s, h, kv_heads, 8) for name, (b, t, s, h, kv_heads, _, _) in STRUCTURED.items()]

    def run(cases):
        results = []
        for (q, k, v, g), (b, t, s, h, _, causal, options) in zip(cases, STRUCTURED.values()):
            dense = attention.make_mask(b, t, s, causal=causal, **options).visible()
            params = variant_params(variant, h)
            attend = functools.partial(attention.attend, variant=variant, **params)
            structured = functools.partial(attend, causal=causal, implementation="reference", **options)
            from_dense = functools.partial(
                attend, causal=False, mask=dense, implementation=implementation, **IMPLEMENTATIONS[implementation]
            )
            results.append((_vjp(from_dense, q, k, v, g), _vjp(structured, q, k, v, g)))
        return results

    for name, (got, want) in zip(STRUCTURED, jit_call(run, cases)):
        _check_same(got, want, what=name)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("variant", ["ssmax", "lssar", "relu"])  # N_i enters each kind of normalisation
def test_per_head_mask_equals_per_head_runs(variant, implementation):
    """A [B, H, T, S] mask (head h: causal window 2h + 3, GQA) equals attending head by head with that
    window: N_i is counted per head."""
    b, t, h, kv_heads = 2, 17, 4, 2
    q, k, v, g = inputs(key("per-head", variant), b, t, t, h, kv_heads, 8)
    windows = [2 * head + 3 for head in range(h)]
    dense_BHTS = jnp.concatenate([attention.make_mask(b, t, t, window=w).visible() for w in windows], axis=1)
    params = variant_params(variant, h)

    def per_head(q, k, v):
        outs = []
        for head, window in enumerate(windows):
            kv = slice(head // (h // kv_heads), head // (h // kv_heads) + 1)
            head_params = {name: x if jnp.ndim(x) == 0 else x[head : head + 1] for name, x in params.items()}
            out = attention.attend(
                q[:, :, head : head + 1],
                k[:, :, kv],
                v[:, :, kv],
                variant=variant,
                window=window,
                implementation="reference",
                **head_params,
            )
            outs.append(out)
        return jnp.concatenate(outs, axis=2)

    dense = functools.partial(
        attention.attend,
        variant=variant,
        mask=dense_BHTS,
        implementation=implementation,
        **params,
        **IMPLEMENTATIONS[implementation],
    )
    got, want = jit_call(lambda q, k, v, g: (_vjp(dense, q, k, v, g), _vjp(per_head, q, k, v, g)), q, k, v, g)
    _check_same(got, want, what="per head")


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_random_dense_mask_matches_oracle(variant, implementation):
    """An arbitrary dense mask (with a fully hidden row), ANDed with causal + a KV-cache offset: values
    and weights against the float64 oracle, N_i being the combined mask's row sum."""
    b, t, s = 2, 11, 21
    q, k, v, _ = inputs(key("random", variant), b, t, s, 2, 1, 8)
    random_B1TS = jax.random.bernoulli(key("random-mask", variant), 0.6, (b, 1, t, s)).at[1, 0, 3].set(False)
    combined = np.asarray(random_B1TS[:, 0]) & np.asarray(
        attention.make_mask(b, t, s, q_offset=jnp.array([3, 10])).visible()[:, 0]
    )
    options = dict(variant=variant, mask=random_B1TS, q_offset=jnp.array([3, 10]))
    out = jit_call(
        lambda q, k, v: attention.attend(q, k, v, implementation=implementation, **options, **IMPLEMENTATIONS[implementation]),
        q,
        k,
        v,
    )
    assert_close(out, oracle.attend(q, k, v, combined, variant), 1e-4, "values")
    assert float(jnp.abs(out[1, 3]).max()) == 0.0  # N_i = 0: zeros
    assert_close(attention.attention_weights(q, k, v, **options), oracle.weights(q, k, combined, variant), 1e-4, "weights")


@pytest.mark.parametrize("variant", ["softmax", "ssmax", "sigmoid", "relu"])
def test_scale_replaces_inverse_sqrt_d(variant):
    """scale=c is the default with q multiplied by c·sqrt(d)."""
    q, k, v, _ = inputs(key("scale", variant), 1, 7, 7, 2, 2, 16)
    scaled = attention.attend(q, k, v, variant=variant, scale=0.3, implementation="reference")
    want = attention.attend(q * (0.3 * 4.0), k, v, variant=variant, implementation="reference")
    assert_close(scaled, want, 1e-5, "scale")
    assert not np.allclose(scaled, attention.attend(q, k, v, variant=variant, implementation="reference"))


def _poison_case(name: str, variant: str):
    """(q, k, v, g, options, hidden_BS): keys no query of their batch row sees, and a row with N_i = 0."""
    q, k, v, g = inputs(key("poison", name, variant), 2, 5, 16, 4, 2, 8)
    options = dict(q_offset=jnp.array([5, 9]), kv_mask=jnp.arange(16) >= jnp.array([[2], [0]]))  # cache tail + padding
    if name == "dense":  # key 3 hidden from every query; query 2 of row 1 sees nothing (N_i = 0)
        options["mask"] = jnp.ones((2, 4, 5, 16), bool).at[:, :, :, 3].set(False).at[1, :, 2].set(False)
    hidden_BS = ~jnp.any(attention.make_mask(2, 5, 16, **options).visible(), axis=(1, 2))
    return q, k, v, g, options, hidden_BS


# implementation: (its options, the poison cases it takes); Pallas (interpret mode) takes no dense mask.
POISONED = {name: (options, ("structured", "dense")) for name, options in IMPLEMENTATIONS.items()}
POISONED["pallas"] = (dict(interpret=True, block_q=8, block_k=8), ("structured",))
# the kernels: softmax and lssar are poisoned in test_pallas.py::test_masked_nan_and_inf_never_leak, these the rest
POISON_CASES = [(v, name) for name in POISONED for v in (("lssa", "relu") if name == "pallas" else VARIANTS)]


@pytest.mark.parametrize("variant, implementation", POISON_CASES)
def test_hidden_nan_and_inf_change_nothing(variant, implementation):
    """NaN keys and ±Inf values where no query of the batch row looks (padding, unfilled cache slots,
    a dense mask) leave every output and every gradient exactly as with finite values there; the
    hidden rows' own gradients are 0 and a row with N_i = 0 outputs zeros."""
    implementation_options, names = POISONED[implementation]
    cases = {name: _poison_case(name, variant) for name in names}
    params = variant_params(variant, 4)

    garbage_B111 = jnp.array([jnp.inf, -jnp.inf])[:, None, None, None]
    results = {}
    for name, (q, k, v, g, options, hidden_BS) in cases.items():
        hidden_BS11 = hidden_BS[:, :, None, None]
        attend = functools.partial(
            attention.attend, variant=variant, implementation=implementation, **options, **params, **implementation_options
        )
        run = jax.jit(lambda q, k, v, g, attend=attend: _vjp(attend, q, k, v, g))  # one program: only the inputs differ
        poisoned = run(q, jnp.where(hidden_BS11, jnp.nan, k), jnp.where(hidden_BS11, garbage_B111, v), g)
        results[name] = (run(q, k, v, g), poisoned, hidden_BS11)
    for name, (clean, poisoned, hidden_BS11) in results.items():
        for what, x, y in zip(["out", "dq", "dk", "dv"], [poisoned[0], *poisoned[1]], [clean[0], *clean[1]]):
            assert np.all(np.isfinite(x)), f"{name}: {what} not finite"
            np.testing.assert_array_equal(x, y, err_msg=f"{name} {what}")
        for grad in clean[1][1:]:
            assert float(jnp.abs(jnp.where(hidden_BS11, grad, 0.0)).max()) == 0.0
    if "dense" in results:
        assert float(jnp.abs(results["dense"][1][0][1, 2]).max()) == 0.0  # the empty row, poisoned run


Q = np.zeros((1, 4, 2, 8), np.float32)
BAD_INPUTS = {  # name: (attend keyword arguments over a softmax default, the error's words)
    "int q": (dict(q=Q.astype(np.int32)), "floating point"),
    "bool v": (dict(v=Q.astype(bool)), "floating point"),
    "empty queries": (dict(q=Q[:, :0]), "q_len and kv_len must be > 0"),
    "empty keys": (dict(k=Q[:, :0], v=Q[:, :0]), "q_len and kv_len must be > 0"),
    "p zero": (dict(variant="lssar", p=0.0), "p must be > 0"),
    "p negative": (dict(variant="lssar", p=-2), "p must be > 0"),
    "p nan": (dict(variant="lssar", p=float("nan")), "p must be > 0 and finite"),
    "p inf": (dict(variant="lssar", p=np.float32("inf")), "p must be > 0 and finite"),
    "p vector": (dict(variant="lssar", p=np.ones(2)), "p must be a scalar"),
    "s nan": (dict(variant="ssmax", s=float("nan")), "s must be finite"),
    "s inf in one head": (dict(variant="ssmax", s=np.array([1.0, np.inf])), "s must be finite"),
    "s wrong length": (dict(variant="ssmax", s=np.ones(3)), r"s must be a scalar or have shape \[2\]"),
    "b inf": (dict(variant="ssmax", b=float("inf")), "b must be finite"),
    "b wrong length": (dict(variant="ssmax", b=np.ones(5)), r"b must be a scalar or have shape \[2\]"),
    "scale zero": (dict(scale=0.0), "scale must be > 0"),
    "scale nan": (dict(variant="sigmoid", scale=float("nan")), "scale must be > 0 and finite"),
    "scale with lssa": (dict(variant="lssa", scale=0.5), "takes no scale"),
    "scale with lssar": (dict(variant="lssar", scale=0.5), "takes no scale"),
    "window zero": (dict(window=0), "window must be a positive int"),
    "window negative": (dict(window=-3), "window must be a positive int"),
    "window float": (dict(window=2.5), "window must be a positive int"),
    "block_q zero": (dict(implementation="blockwise", block_q=0), "block_q must be a positive int"),
    "block_k float": (dict(implementation="blockwise", block_k=4.0), "block_k must be a positive int"),
    "mask not boolean": (dict(mask=np.ones((1, 1, 4, 4), np.int32)), "mask must be boolean"),
    "mask wrong length": (dict(mask=np.ones((1, 1, 4, 3), bool)), r"mask must have shape \[1 or 1, heads or 1, 4, 4\]"),
    "mask wrong heads": (dict(mask=np.ones((1, 3, 4, 4), bool)), "head axis must be 1 or num_heads=2"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_a_clear_value_error(case):
    overrides, words = BAD_INPUTS[case]
    kwargs = {"q": Q, "k": Q, "v": Q, "variant": "softmax", **overrides}
    with pytest.raises(ValueError, match=words):
        attention.attend(kwargs.pop("q"), kwargs.pop("k"), kwargs.pop("v"), **kwargs)


def test_traced_options_are_not_checked_by_value():
    """s, b, p, scale and q_offset as jit arguments trace (no concretization) and equal the eager call
    (the checks are shared by every implementation); a wrong-length s is still refused under jit."""
    q, k, v, _ = inputs(key("traced"), 1, 6, 9, 2, 1, 8)
    implementation, blocks = "reference", {}
    calls = {
        "ssmax": lambda s, b, offset: attention.attend(
            q, k, v, variant="ssmax", s=s, b=b, q_offset=offset, implementation=implementation, **blocks
        ),
        "lssar": lambda p, offset: attention.attend(
            q, k, v, variant="lssar", p=p, q_offset=offset, implementation=implementation, **blocks
        ),
        "softmax": lambda scale, offset: attention.attend(
            q, k, v, variant="softmax", scale=scale, q_offset=offset, implementation=implementation, **blocks
        ),
    }
    args = {
        "ssmax": (jnp.array([0.7, 1.2]), jnp.float32(0.1), jnp.int32(2)),
        "lssar": (jnp.float32(3.0), jnp.int32(2)),
        "softmax": (jnp.float32(0.2), jnp.int32(2)),
    }
    for name, call in calls.items():
        assert_close(jax.jit(call)(*args[name]), call(*args[name]), 1e-6, name)
    with pytest.raises(ValueError, match="s must be a scalar"):
        jax.jit(calls["ssmax"])(jnp.ones(3), jnp.float32(0.1), jnp.int32(2))


def test_dense_mask_skips_empty_blocks():
    """Two bidirectional documents as a dense block-diagonal mask: tiles with no True are skipped
    (8-wide blocks, documents of 16) and the output still equals the reference."""
    q, k, v, _ = inputs(key("skip-dense"), 1, 32, 32, 2, 2, 8)
    document_T = jnp.arange(32) // 16
    dense_11TS = (document_T[:, None] == document_T[None, :])[None, None]
    mask = attention.make_mask(1, 32, 32, causal=False, mask=dense_11TS)
    maybe_IJ = jit_call(lambda mask: blockwise.make_plan(mask, block_plan.count_visible(mask, 8)[0], 8, 8, 2).maybe_IJ, mask)
    np.testing.assert_array_equal(maybe_IJ, np.kron(np.eye(2, dtype=bool), np.ones((2, 2), bool)))
    attend = functools.partial(attention.attend, variant="lssa", causal=False, mask=dense_11TS)
    outs = jit_call(
        lambda q, k, v: [attend(q, k, v, implementation=name, **blocks) for name, blocks in IMPLEMENTATIONS.items()], q, k, v
    )
    assert_close(outs[1], outs[0], 1e-5, "blockwise")
