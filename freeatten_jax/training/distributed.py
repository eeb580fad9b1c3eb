"""Multi-process start-up and input assembly: one JAX process per host (TPU slice, SLURM, MPI)."""
import os

import jax
import numpy as np

from freeatten_jax.nn.sharding import Rules, batch_sharding

_MULTI_PROCESS_SIGNS = {
    "JAX_COORDINATOR_ADDRESS": lambda v: bool(v),
    "SLURM_NTASKS": lambda v: int(v) > 1,
    "OMPI_COMM_WORLD_SIZE": lambda v: int(v) > 1,
    "TPU_WORKER_HOSTNAMES": lambda v: "," in v,
    "MEGASCALE_COORDINATOR_ADDRESS": lambda v: bool(v),
}


def is_multi_process(environ=os.environ) -> bool:
    """True when the environment describes several JAX processes (TPU slice, SLURM, MPI)."""
    return any(sign(environ[name]) for name, sign in _MULTI_PROCESS_SIGNS.items() if environ.get(name))


def initialize_distributed(environ=os.environ) -> bool:
    """Calls jax.distributed.initialize() (auto-detected cluster) once, when multi-process."""
    if jax.distributed.is_initialized():
        return True
    if not is_multi_process(environ):
        return False
    jax.distributed.initialize()
    return True


def host_local_batch_to_global(batch: np.ndarray, mesh, rules: Rules) -> jax.Array:
    """Assembles each process's rows of a [B, T] batch into one global, sharded jax.Array."""
    global_shape = (batch.shape[0] * jax.process_count(), *batch.shape[1:])
    sharding = batch_sharding(mesh, rules, global_shape)
    return jax.make_array_from_process_local_data(sharding, batch, global_shape)
