"""Validation during training: the mean loss over the first `train.eval_windows` held-out windows of the training
length, in micro-batches laid out as training's."""

import jax
import numpy as np

from freeatten_jax import data
from freeatten_jax.nn import sharding
from freeatten_jax.training import step as train_step


class Evaluator:
    def __init__(self, cfg, splits, mesh):
        rules = cfg.mesh.rules
        windows_WL = data.held_out_windows(cfg.data, splits, cfg.train.seq_len, cfg.train.eval_windows)
        batch = cfg.train.batch_size // cfg.train.grad_accum_steps  # a micro-batch: what fits in memory
        pad = -len(windows_WL) % batch
        self.tokens_NBL = np.concatenate([windows_WL, np.zeros((pad, windows_WL.shape[1]), np.int32)]).reshape(
            -1, batch, windows_WL.shape[1]
        )
        self.weights_NB = np.concatenate([np.ones(len(windows_WL), np.float32), np.zeros(pad, np.float32)]).reshape(-1, batch)
        self.tokens_sharding = sharding.batch_sharding(mesh, rules, self.tokens_NBL.shape[1:])
        self.weights_sharding = sharding.logical_spec(("batch",), self.weights_NB.shape[1:], mesh, rules)
        self.weights_sharding = jax.sharding.NamedSharding(mesh, self.weights_sharding)
        self.step = train_step.make_eval_step(cfg)

    def __call__(self, state) -> float:
        total = count = 0.0
        for tokens_BL, weights_B in zip(self.tokens_NBL, self.weights_NB):
            tokens = jax.make_array_from_callback(tokens_BL.shape, self.tokens_sharding, lambda i, x=tokens_BL: x[i])
            weights = jax.make_array_from_callback(weights_B.shape, self.weights_sharding, lambda i, x=weights_B: x[i])
            loss_sum, n = self.step(state, tokens, weights)
            total, count = total + float(loss_sum), count + float(n)
        return total / count
