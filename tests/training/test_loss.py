"""The token loss in chunks (training.loss): equal to the whole-logits loss, values and gradients, and never
holding the whole [B, T, V] logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from freeatten_jax.nn import Transformer, preset
from freeatten_jax.training import loss

B, L, V = 2, 25, 50  # T = 24 positions: chunks of 24 / n


def _model(tie: bool):
    cfg = preset("tiny", num_layers=1, d_model=32, num_heads=4, mlp_dim=64, vocab_size=V, max_len=32, tie_embeddings=tie)
    return Transformer(cfg, rngs=nnx.Rngs(0))


def _loss_and_grads(model, tokens_BL, **kwargs):
    """The mean loss, its parameter gradients and the per-position losses, and the jaxpr of the gradient."""

    def fn(m):
        losses_BT = loss.next_token_losses(m, tokens_BL, eos_id=1, **kwargs)
        return jnp.mean(losses_BT), losses_BT

    grad = nnx.value_and_grad(fn, has_aux=True)
    (_, losses_BT), grads = nnx.jit(grad)(model)
    graphdef, state = nnx.split(model)
    jaxpr = str(jax.make_jaxpr(lambda s: grad(nnx.merge(graphdef, s)))(state))
    return losses_BT, grads, jaxpr


@pytest.mark.parametrize(  # each chunk count and each head once (the count itself: the divisor test below)
    "max_logits, tie", [(B * 24 * V // 3, False), (B * 24 * V // 7, True)], ids=["3_chunks-untied", "8_chunks-tied"]
)
def test_chunked_loss_equals_the_whole_logits_loss_and_never_holds_them(max_logits, tie):
    """Chunks of the sequence (strided positions, recomputed in the backward) give the same per-position losses
    and parameter gradients as the whole logits (EOS document masking on), and no [B, T, V] array exists."""
    model = _model(tie)
    tokens_BL = jax.random.randint(jax.random.key(0), (B, L), 0, V)
    whole, whole_grads, whole_jaxpr = _loss_and_grads(model, tokens_BL)
    chunked, chunked_grads, chunked_jaxpr = _loss_and_grads(model, tokens_BL, max_logits=max_logits)
    np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-5)
    for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(chunked_grads), jax.tree.leaves(whole_grads)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path))
    whole_logits = f"f32[{B},{L - 1},{V}]"
    assert whole_logits in whole_jaxpr and whole_logits not in chunked_jaxpr
    assert "remat" not in whole_jaxpr and "remat" in chunked_jaxpr  # each chunk's logits recomputed, not kept


def test_chunk_count_is_the_fewest_divisor_within_the_bound():
    assert loss.chunk_count(24, 100, 100) == 1
    assert loss.chunk_count(24, 101, 100) == 2
    assert loss.chunk_count(24, 500, 100) == 6  # 5 does not divide 24
    assert loss.chunk_count(7, 10**9, 1) == 7  # at most one position per chunk
