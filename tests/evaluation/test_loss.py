"""Evaluation metrics against hand-computed values: loss over the last training-length positions, needle
mass, entropy and max weight per N_i bucket (on a stand-in model with known attention), every eval-time
switch's effect on a real model, and eval losses under document masking (passkey prompts and scoring: test_eval.py).

Glossary: B batch, T positions, H heads, K kv heads, D head dim, W windows, N visible keys (N_i = i + 1).
"""

import types

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from freeatten_jax.evaluation import attention_stats, loss, switches
from freeatten_jax.nn import Transformer, preset
from freeatten_jax.training.loss import next_token_losses

MARK, BOOST = 1, 100.0  # tokens equal to MARK get e^logit = BOOST times the weight of the others in head 1


class _SoftmaxLayer:
    variant = "softmax"

    @staticmethod
    def variant_options():
        return {"scale": 1.0}  # scores are plain q·k


class KnownAttention(nnx.Module):
    """A stand-in model with one softmax layer and two heads of D = 1: head 0 attends uniformly (q = 0),
    head 1 gives each key whose token is MARK weight BOOST relative to the others (q = 1, k = log BOOST)."""

    @property
    def attention_layers(self):
        return (_SoftmaxLayer(),)

    def attention_qk(self, tokens_BT):
        b, t = tokens_BT.shape
        q_BTHD = jnp.broadcast_to(jnp.array([0.0, 1.0])[None, None, :, None], (b, t, 2, 1))
        marked_BT = jnp.where(tokens_BT == MARK, jnp.log(BOOST), 0.0)
        k_BTKD = jnp.stack([jnp.zeros((b, t)), marked_BT], axis=-1)[..., None]
        return None, ((q_BTHD, k_BTKD),)


def test_loss_last_train_len_averages_the_last_positions():
    losses_WT = np.array([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [7.0, 8.0, 9.0, 10.0, 11.0, 12.0]])
    summary = loss.summarise(losses_WT, train_len=2)
    assert summary["loss"] == pytest.approx(6.5)
    assert summary["loss_last_train_len"] == pytest.approx((5 + 6 + 11 + 12) / 4)  # not the first 2: (1 + 2 + 7 + 8) / 4
    assert summary["windows"] == 2


def test_needle_mass_is_the_last_querys_weight_on_the_needle():
    t, needle = 40, slice(12, 20)
    tokens_1T = np.zeros((1, t), np.int32)
    tokens_1T[0, needle] = MARK
    mass = attention_stats.needle_mass(KnownAttention(), jnp.asarray(tokens_1T), needle)
    m = needle.stop - needle.start
    expected = [m / t, m * BOOST / (m * BOOST + t - m)]  # uniform head; boosted head (0.988; 5 tokens off: 0.34)
    np.testing.assert_allclose(mass, [expected], rtol=1e-5)


def _entropy_and_max(n: int, boosted: bool) -> tuple[float, float]:
    """A row of N visible keys: uniform, or with key 0 (the only MARK) boosted."""
    w = np.full(n, 1.0)
    if boosted:
        w[0] = BOOST
    w /= w.sum()
    return float(-(w * np.log(w)).sum()), float(w.max())


@pytest.mark.parametrize("chunk", [256, 5])  # one chunk of rows, and rows split across chunks
def test_entropy_and_max_weight_per_n_bucket(chunk):
    t = 20
    tokens_BT = np.zeros((2, t), np.int32)
    tokens_BT[:, 0] = MARK
    entropy, max_weight, n_from = attention_stats.entropy_and_max(KnownAttention(), jnp.asarray(tokens_BT), chunk=chunk)
    np.testing.assert_array_equal(n_from, [1, 2, 4, 8, 16])
    buckets = [range(1, 2), range(2, 4), range(4, 8), range(8, 16), range(16, t + 1)]  # N_i = i + 1 in [2^u, 2^(u+1))
    for head, boosted in enumerate((False, True)):
        expected = np.array([[_entropy_and_max(n, boosted) for n in bucket] for bucket in buckets], dtype=object)
        np.testing.assert_allclose(entropy[0, head], [np.mean([e for e, _ in row]) for row in expected], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(max_weight[0, head], [np.mean([w for _, w in row]) for row in expected], rtol=1e-5)
    assert entropy.shape == max_weight.shape == (1, 2, 5)


# ----------------------------------------------------------------------------- switches on a real model


def _model_cfg(attention, **overrides):
    fields = dict(num_layers=2, d_model=32, num_heads=2, mlp_dim=64, vocab_size=40, max_len=16, rope_theta=1000.0)
    return preset("tiny", **{**fields, "attention": attention, **overrides})


def _logits(model_cfg, switch=None):
    """Logits on fixed tokens of a model built from `model_cfg` (the same parameters for every variant), switched."""
    model = Transformer(model_cfg, rngs=nnx.Rngs(0))
    if switch is not None:
        switches.apply(model, types.SimpleNamespace(model=model_cfg), switches.parse(switch))
    tokens_BT = jnp.asarray(np.random.default_rng(0).integers(0, 40, (2, 12)), jnp.int32)
    return model, model(tokens_BT)


@pytest.mark.parametrize(
    "switch, attention, expected",
    [
        ("rope_theta=50x", "lssa", _model_cfg("lssa", rope_theta=50_000.0)),  # relative to the trained 1000, not 50
        ("rope_theta=500", "softmax", _model_cfg("softmax", rope_theta=500.0)),  # absolute
        ("p=15", "lssa", _model_cfg("lssar", attention_options={"p": 15.0})),
        ("p=off", "lssar", _model_cfg("lssa")),
        ("s=0.3", "ssmax", _model_cfg("ssmax", ssmax_s_init=0.3)),
        ("p=3,rope_theta=2x", "lssar", _model_cfg("lssar", attention_options={"p": 3.0}, rope_theta=2000.0)),
        ("rope_linear=4", "softmax", _model_cfg("softmax", rope_scaling="linear", rope_factor=4.0)),
        # llama3 from the trained length (max_len 16): wavelengths 6 to 2,650 in all three bands (< 4, 4..16, > 16)
        ("rope_llama3=8", "lssa", _model_cfg("lssa", rope_scaling="llama3", rope_factor=8.0, rope_original_len=16)),
    ],
)
def test_each_switch_gives_the_model_it_names(switch, attention, expected):
    model, switched = _logits(_model_cfg(attention), switch)
    np.testing.assert_allclose(switched, _logits(expected)[1], atol=1e-6)
    assert all(layer.rope_theta == expected.rope_theta for layer in model.attention_layers)
    assert not np.allclose(switched, _logits(_model_cfg(attention))[1], atol=1e-5)  # the switch does change the model


def test_eval_losses_restart_per_document_as_training_does():
    """Eval's token losses on a document-masked run equal training's (eos_id passed through), not the unmasked ones."""
    model = Transformer(_model_cfg("lssar"), rngs=nnx.Rngs(0))
    windows_WL = np.random.default_rng(1).integers(0, 39, (3, 13)).astype(np.int32)
    windows_WL[:, [4, 9]] = 39  # EOS opens two documents inside each window
    masked = loss.token_losses(model, windows_WL, eos_id=39)
    trained = nnx.jit(next_token_losses, static_argnames="eos_id")(model, jnp.asarray(windows_WL), eos_id=39)  # one program
    np.testing.assert_allclose(masked, trained, rtol=1e-5, atol=1e-6)
    assert not np.allclose(masked, loss.token_losses(model, windows_WL), atol=1e-4)
