"""training/evaluator.py, called directly on a fresh or trained state: the validation loss is the mean token loss over
the first train.eval_windows held-out windows (a last micro-batch padded, the padding not counted), and with the
train step it shows every variant learning (no training loop: the rooms are driven as the loop drives them)."""

import jax
import numpy as np
import pytest
from helpers import tiny_config

from freeatten_jax import data
from freeatten_jax.nn import sharding
from freeatten_jax.training import config, evaluator, optim
from freeatten_jax.training import state as train_state
from freeatten_jax.training import step as train_step
from freeatten_jax.training.loss import next_token_losses


def _start(variant, text_glob, **overrides):
    """(config, mesh, splits, a fresh state, its shardings, the optimizer) of a tiny run on one device."""
    cfg = config.parse(tiny_config(variant, text_glob, **overrides))
    mesh = sharding.make_mesh(cfg.mesh.shape, jax.devices()[:1])
    tx = optim.make(cfg.optim, cfg.train.steps)
    shardings = train_state.abstract_state(cfg, mesh, tx)[1]
    return cfg, mesh, data.load_splits(cfg.data), train_state.create(cfg, mesh, tx, shardings), shardings


def test_the_validation_loss_is_the_mean_token_loss_of_the_first_windows_and_padding_counts_for_nothing(text_glob):
    cfg, mesh, splits, state, _ = _start("softmax", text_glob, **{"train.eval_windows": 5})  # micro-batch 8: 3 padded
    windows_WL = data.held_out_windows(cfg.data, splits, 16, 5)
    model = train_state.model_of(train_state.graphdefs(cfg.model)[1], state)
    expected = float(np.mean(np.asarray(next_token_losses(model, windows_WL))))
    assert evaluator.Evaluator(cfg, splits, mesh)(state) == pytest.approx(expected, rel=1e-5)
    more = config.parse(tiny_config("softmax", text_glob, **{"train.eval_windows": 6}))
    assert evaluator.Evaluator(more, splits, mesh)(state) != pytest.approx(expected, rel=1e-6)  # the 6th window counts


@pytest.mark.parametrize("variant", ["softmax", "ssmax", "lssa", "lssar", "sigmoid", "relu"])
def test_every_variant_lowers_the_validation_loss(variant, text_glob):
    cfg, mesh, splits, state, shardings = _start(variant, text_glob, **{"train.steps": 40})
    step, validate = train_step.make_train_step(cfg, shardings), evaluator.Evaluator(cfg, splits, mesh)
    batches = data.train_dataset(splits.train, 16, 8, seed=0)
    val = []
    with sharding.use_mesh(mesh, cfg.mesh.rules):
        for i in range(40):
            state, _ = step(state, batches[i])
            if (i + 1) % 10 == 0:
                val.append(validate(state))
    assert val[-1] < min(val[:-1]) and val[-1] < np.log(256) - 2.5, val
