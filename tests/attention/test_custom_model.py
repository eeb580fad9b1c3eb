"""A user's own tiny Flax NNX model that imports only `freeatten_jax.attention` trains and its loss drops:
the functional API is reusable outside our Transformer.

Glossary: B batch, T positions, E width, H heads, D head dim, V vocabulary.
"""

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from freeatten_jax import attention

V, E, H, T, PERIOD = 16, 32, 4, 24, 5


class TinyLM(nnx.Module):
    """Token + learned position embeddings, one attention layer (any variant) with residual, unembedding."""

    def __init__(self, variant: str, *, rngs: nnx.Rngs):
        init = nnx.initializers.normal(0.1)
        self.variant = variant
        self.tok_VE = nnx.Param(init(rngs.params(), (V, E)))
        self.pos_TE = nnx.Param(init(rngs.params(), (T, E)))
        self.qkv_3EHD = nnx.Param(init(rngs.params(), (3, E, H, E // H)))
        self.out_HDE = nnx.Param(init(rngs.params(), (H, E // H, E)))
        self.unembed_EV = nnx.Param(init(rngs.params(), (E, V)))

    def __call__(self, tokens_BT):
        x_BTE = self.tok_VE[...][tokens_BT] + self.pos_TE[...]
        q_BTHD, k_BTHD, v_BTHD = jnp.einsum("BTE,CEHD->CBTHD", x_BTE, self.qkv_3EHD[...])
        o_BTHD = attention.attend(q_BTHD, k_BTHD, v_BTHD, variant=self.variant)
        x_BTE = x_BTE + jnp.einsum("BTHD,HDE->BTE", o_BTHD, self.out_HDE[...])
        return x_BTE @ self.unembed_EV[...]


def _loss(model, tokens_BT):
    logits_BTV = model(tokens_BT[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits_BTV, tokens_BT[:, 1:]).mean()


@nnx.jit
def _train_step(model, optimizer, tokens_BT):
    loss, grads = nnx.value_and_grad(_loss)(model, tokens_BT)
    optimizer.update(model, grads)
    return loss


def test_user_model_with_lssar_trains():
    """Sequences repeat a random 5-token pattern: predictable only by attending back 5 positions."""
    model = TinyLM("lssar", rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(3e-2), wrt=nnx.Param)
    losses = []
    for step in range(40):
        pattern_BP = jax.random.randint(jax.random.key(step), (16, PERIOD), 0, V)
        losses.append(float(_train_step(model, optimizer, jnp.tile(pattern_BP, (1, T // PERIOD + 2))[:, : T + 1])))
    assert losses[0] > 2.5  # about log(16) at the start
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0], losses
