"""docs/drop_in.md's Python snippets run as written, each in a fresh namespace, and do what the page says of them."""

import pathlib
import re

import numpy as np
import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "drop_in.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def _flax_attention_fn(ns):
    """Case 1: Flax's MultiHeadAttention with our function; its own cache's first decoded token is the full causal
    pass's first position; the padding mask reaches our function (row 0 changes where it has padding, row 1 not)."""
    mha, x_BTE, nnx = ns["mha"], np.random.default_rng(0).normal(size=(2, 16, 64)).astype(np.float32), ns["nnx"]
    assert ns["y_BTE"].shape == (2, 16, 64) and np.isfinite(np.asarray(ns["y_BTE"])).all()
    padded, causal = (np.asarray(mha(x_BTE, mask=m, decode=False)) for m in (ns["mask"], nnx.make_causal_mask(x_BTE[..., 0])))
    np.testing.assert_allclose(padded[1], causal[1], atol=1e-6)
    assert not np.allclose(padded[0, 12:], causal[0, 12:], atol=1e-4)
    np.testing.assert_allclose(
        np.asarray(ns["y0_B1E"]), np.asarray(mha(ns["x_BTE"], mask=ns["mask"], decode=False))[:, :1], atol=1e-5
    )


def _linen_module(ns):
    """Case 2: a linen block for each variant, whose outputs differ (the variant is what changed)."""
    assert ns["y_BxLxD"].shape == (2, 16, 64)
    block, x_BxLxD = ns["CausalAttn"], np.random.default_rng(0).normal(size=(2, 16, 64)).astype(np.float32)
    jax = ns["jax"]
    outs = [b.apply(b.init(jax.random.key(0), x_BxLxD), x_BxLxD) for b in (block(variant="ssmax"), block(variant="lssar"))]
    assert not np.allclose(*outs, atol=1e-4)


def _gemma_style(ns):
    """Case 3: the Gemma-style module takes its dense mask: row 0's padding changes its queries from 5 on, row 1 has none."""
    block, segment_pos_BT, jnp = ns["block"], ns["segment_pos_BT"], ns["jnp"]
    x_BTD = np.random.default_rng(0).normal(size=(2, 8, 32)).astype(np.float32)
    causal_BTS = jnp.tril(jnp.ones((8, 8), bool))[None].repeat(2, 0)
    padded, causal = (np.asarray(block(x_BTD, segment_pos_BT, m)) for m in (ns["attn_mask_BTS"], causal_BTS))
    assert padded.shape == (2, 8, 32)
    np.testing.assert_allclose(padded[1], causal[1], atol=1e-6)
    np.testing.assert_allclose(padded[0, :5], causal[0, :5], atol=1e-6)
    assert not np.allclose(padded[0, 5:], causal[0, 5:], atol=1e-4)


CHECKS = (_flax_attention_fn, _linen_module, _gemma_style)


def test_the_three_cases_are_there():
    assert len(BLOCKS) == len(CHECKS) == 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_snippet_runs_and_does_what_the_page_says(index):
    namespace = {"__name__": "drop_in"}
    exec(compile(BLOCKS[index], f"{DOC}:block{index}", "exec"), namespace)
    CHECKS[index](namespace)
