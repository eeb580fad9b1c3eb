"""attention/finite.py: `check_finite=True` passes inputs at the edge of the range docs/method.md §8 guarantees, where
every implementation's output is finite and the float64 oracle's; just beyond it, and for the issue's bfloat16 1e30,
it raises one error naming the input (the misuse table, test_misuse.py, holds those rows); keys that no query sees may
still hold NaN."""

import attention_oracle as oracle
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import INTERPRET, assert_close

from freeatten_jax import attention
from freeatten_jax.attention import finite

IMPLEMENTATIONS = {"reference": {}, "blockwise": {"block_q": 4, "block_k": 4}, "pallas": {"interpret": INTERPRET}}


def _at_the_edge(variant: str, fraction: float):
    """q, k, v [1, 8, 2, 16]: q and k rows of one norm, so that the score bound |q_i|·|k_j| (the factors, 1/4 and at
    most 1/4 · log 8 for ssmax, are below 1) is `fraction` of SCORE_LIMIT; random directions, so causal rows see scores
    far below 0 and far above; v standard normal."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(1, 8, 2, 16)) for _ in range(3))
    size = np.sqrt(fraction * finite.SCORE_LIMIT)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    return (unit(q) * size).astype(np.float32), (unit(k) * size).astype(np.float32), v.astype(np.float32)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("variant", list(attention.VARIANTS))
def test_inputs_at_the_edge_of_the_guaranteed_range_pass_and_give_the_oracles_finite_output(variant, implementation):
    q, k, v = _at_the_edge(variant, 0.5)
    out = attention.attend(
        q, k, v, variant=variant, implementation=implementation, check_finite=True, **IMPLEMENTATIONS[implementation]
    )
    want = oracle.attend(q, k, v, np.tril(np.ones((8, 8), bool))[None], variant)
    assert_close(out, want, 1e-4, f"{variant} via {implementation}")


@pytest.mark.parametrize("variant", list(attention.VARIANTS))
def test_inputs_just_beyond_it_are_refused_naming_the_input(variant):
    q, k, v = _at_the_edge(variant, 1.01)
    with pytest.raises(ValueError, match=r"^check_finite: q and k overflow together: .* not below 1e\+29") as raised:
        attention.attend(q, k, v, variant=variant, check_finite=True)
    assert "\n" not in str(raised.value)


def test_the_issues_bfloat16_1e30_gives_nan_unchecked_and_one_error_checked():
    q = jnp.full((1, 8, 2, 16), 1e30, jnp.bfloat16)
    assert np.isnan(np.asarray(attention.attend(q, q, q, variant="softmax"), np.float32)).all()  # what the check prevents
    with pytest.raises(ValueError, match=r"^check_finite: q and k overflow together: \|q_i\| up to 4e\+30"):
        attention.attend(q, q, q, variant="softmax", check_finite=True)


def test_nan_in_keys_and_values_no_query_sees_passes_the_check():
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(1, 8, 2, 16)).astype(np.float32) for _ in range(3))
    k[0, 7], v[0, 7] = np.nan, np.inf  # padding: kv_mask hides key 7 from every query
    out = attention.attend(q, k, v, variant="lssar", kv_mask=np.arange(8) < 7, check_finite=True)
    assert np.isfinite(np.asarray(out)).all()
