"""The training state as one pytree, its shardings, and the model it came from.

state = {"params": nnx.State of nnx.Param, "rest": the model's other variables (dropout RNG streams),
         "opt_state": optax state, "step": int32 scalar (optimiser steps done)}.
"""
import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from freeatten_jax import sharding
from freeatten_jax.model import Transformer


def builder(cfg):
    """A zero-argument function building the (unsharded) model with the run's seed."""
    return lambda: Transformer(cfg.model, rngs=nnx.Rngs(cfg.train.seed))


def _split(model: nnx.Module):
    return nnx.split(model, nnx.Param, ...)


def _init(cfg, tx):
    graphdef, params, rest = _split(builder(cfg)())
    return graphdef, {"params": params, "rest": rest, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}


def graphdefs(cfg):
    """(train graphdef, eval graphdef): the same state, dropout on or off."""
    model = nnx.eval_shape(builder(cfg))
    model.train()
    train_def = _split(model)[0]
    model.eval()
    return train_def, _split(model)[0]


def shardings(abstract, mesh, rules):
    """NamedShardings for a state pytree: variables by their logical axes, everything else replicated."""
    replicated = NamedSharding(mesh, PartitionSpec())

    def one(x):
        return sharding.state_shardings(x, mesh, rules) if isinstance(x, nnx.Variable) else replicated

    return jax.tree.map(one, abstract, is_leaf=lambda x: isinstance(x, nnx.Variable))


def abstract_state(cfg, mesh, tx):
    """(ShapeDtypeStructs carrying their shardings, the shardings): no array is created."""
    abstract = jax.eval_shape(lambda: _init(cfg, tx)[1])
    state_shardings = shardings(abstract, mesh, cfg.mesh.rules)
    to_struct = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
    return jax.tree.map(to_struct, abstract, state_shardings), state_shardings


def create(cfg, mesh, tx, state_shardings):
    """A fresh state, every array created directly in its sharding."""
    with sharding.use_mesh(mesh, cfg.mesh.rules):
        return jax.jit(lambda: _init(cfg, tx)[1], out_shardings=state_shardings)()


def model_of(graphdef, state) -> nnx.Module:
    """The nnx model holding the state's parameters."""
    return nnx.merge(graphdef, state["params"], state["rest"])
