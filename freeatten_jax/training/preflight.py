"""Checks a run makes before it writes anything: the mesh it asks for, a batch that divides over processes and
devices, a sequence that splits over the context axis, and data that fits the model and fills its windows."""

import math

import jax
import numpy as np

from freeatten_jax import data
from freeatten_jax.attention import mesh_axes
from freeatten_jax.errors import ConfigError
from freeatten_jax.nn import sharding
from freeatten_jax.training import config, distributed


def make_mesh(cfg: config.Config):
    """The run's mesh; a single process may use fewer devices than it has: all of them for a -1 in the shape, else
    the first ones."""
    shape = cfg.mesh.shape
    devices = jax.devices() if -1 in shape or jax.process_count() > 1 else jax.devices()[: int(np.prod(shape))]
    try:
        mesh = sharding.make_mesh(shape, devices, cfg.mesh.slices)
    except ValueError as e:
        raise ConfigError(f"config.{e}") from None
    check_batch(cfg, mesh)
    return mesh


def check_batch(cfg: config.Config, mesh) -> None:
    readers, batch = distributed.data_shard(mesh, cfg.mesh.rules)[1], cfg.train.batch_size
    replicas = math.prod(mesh.shape[axis] for axis in mesh_axes.BATCH)
    micro = batch // cfg.train.grad_accum_steps
    if batch % readers or micro % replicas:
        raise ConfigError(
            f"config.train.batch_size={batch} must be divisible by the {readers} processes reading different rows, and "
            f"each of its {cfg.train.grad_accum_steps} micro-batches ({micro}) by the "
            f"{replicas} data-parallel devices (mesh data x fsdp)"
        )
    if error := mesh_axes.context_length_error("config.train.seq_len", cfg.train.seq_len, mesh.shape[mesh_axes.CONTEXT]):
        raise ConfigError(error)


def check_data(cfg: config.Config, splits: data.Splits) -> None:
    """The vocabulary fits the model, and the data fills one training window per process and one validation window."""
    if cfg.model.vocab_size < splits.vocab_size:
        raise ConfigError(
            f"config.model.vocab_size={cfg.model.vocab_size} is smaller than the data's "
            f"vocabulary ({splits.vocab_size}); allowed: None (take the data's) or >= {splits.vocab_size}"
        )
    if data.synthetic_windows(cfg.data, cfg.train.seq_len, cfg.train.seed) is not None:
        return  # drawn per window: any number of them
    length = cfg.train.seq_len + 1
    if data.num_chunks(splits.train, length) < jax.process_count():
        tokens = sum(len(s) for s in splits.train)
        raise data.DataError(
            f"the training data has {tokens} tokens: too few for {jax.process_count()} window(s) of "
            f"config.train.seq_len + 1 = {length} tokens; lower train.seq_len or give more data"
        )
    if not sum(len(s) // length for s in splits.val):
        tokens = sum(len(s) for s in splits.val)
        raise data.DataError(
            f"the validation data has {tokens} tokens: too few for one window of config.train.seq_len + 1 = "
            f"{length} tokens; raise data.val_fraction, lower train.seq_len or give more data"
        )
