"""The training state as one pytree, its shardings, and the model it came from.

state = {"params": nnx.State of nnx.Param, "rest": the model's other variables (dropout RNG streams),
         "opt_state": optax state, "step": int32 scalar (optimiser steps done)}.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from freeatten_jax.nn import Transformer, sharding
from freeatten_jax.nn.config import ModelConfig


def builder(model_cfg: ModelConfig, seed: int):
    """A zero-argument function building the (unsharded) model with the run's seed."""
    return lambda: Transformer(model_cfg, rngs=nnx.Rngs(seed))


def split(model: nnx.Module):
    """(graphdef, params, rest): how every state here is cut."""
    return nnx.split(model, nnx.Param, ...)


def model_state(model_cfg: ModelConfig, seed: int) -> dict:
    """{"params", "rest"} of a freshly initialised model."""
    _, params, rest = split(builder(model_cfg, seed)())
    return {"params": params, "rest": rest}


def _init(cfg, tx) -> dict:
    state = model_state(cfg.model, cfg.train.seed)
    return {**state, "opt_state": tx.init(state["params"]), "step": jnp.zeros((), jnp.int32)}


def graphdefs(model_cfg: ModelConfig):
    """(train graphdef, eval graphdef): the same state, dropout on or off."""
    model = nnx.eval_shape(builder(model_cfg, 0))
    model.train()
    train_def = split(model)[0]
    model.eval()
    return train_def, split(model)[0]


def abstract_state(cfg, mesh, tx):
    """(ShapeDtypeStructs carrying their shardings, the shardings) of the whole training state."""
    return sharding.abstract(lambda: _init(cfg, tx), mesh, cfg.mesh.rules)


def create(cfg, mesh, tx, state_shardings):
    """A fresh state, every array created directly in its sharding."""
    with sharding.use_mesh(mesh, cfg.mesh.rules):
        return jax.jit(lambda: _init(cfg, tx), out_shardings=state_shardings)()


def model_of(graphdef, state) -> nnx.Module:
    """The nnx model holding the state's parameters."""
    return nnx.merge(graphdef, state["params"], state["rest"])
