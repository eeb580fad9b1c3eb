"""Multi-process start-up and input assembly: one JAX process per host (TPU slice, SLURM, MPI, or given by hand).

`Cluster` holds the command line's --coordinator_address / --num_processes / --process_id; fields left None are
auto-detected by jax.distributed.initialize on TPU/GPU clusters. On CPU the processes talk over gloo.
A process whose peer dies is stopped by the coordination service's heartbeat (`heartbeat_timeout_s`).
"""
import dataclasses
import os

import jax
import numpy as np

from freeatten_jax.errors import ConfigError
from freeatten_jax.nn.sharding import Rules, batch_sharding

_MULTI_PROCESS_SIGNS = {
    "JAX_COORDINATOR_ADDRESS": lambda v: bool(v),
    "SLURM_NTASKS": lambda v: int(v) > 1,
    "OMPI_COMM_WORLD_SIZE": lambda v: int(v) > 1,
    "TPU_WORKER_HOSTNAMES": lambda v: "," in v,
    "MEGASCALE_COORDINATOR_ADDRESS": lambda v: bool(v),
}


@dataclasses.dataclass(frozen=True)
class Cluster:
    """This process's place in a multi-process run; None: auto-detected (TPU pods, SLURM, MPI)."""

    coordinator_address: str | None = None  # host:port of process 0's coordination service
    num_processes: int | None = None
    process_id: int | None = None
    heartbeat_timeout_s: int = 100  # a process whose peer stops answering for this long is stopped

    def __post_init__(self):
        given = [self.coordinator_address, self.num_processes, self.process_id]
        if any(v is not None for v in given) and any(v is None for v in given):
            raise ConfigError("--coordinator_address, --num_processes and --process_id go together: give all three or none")
        if self.num_processes is not None and not 0 <= self.process_id < self.num_processes:
            raise ConfigError(f"--process_id={self.process_id} is invalid; allowed: 0 .. --num_processes - 1 = {self.num_processes - 1}")

    @property
    def given(self) -> bool:
        return self.coordinator_address is not None


def is_multi_process(environ=os.environ) -> bool:
    """True when the environment describes several JAX processes (TPU slice, SLURM, MPI)."""
    return any(sign(environ[name]) for name, sign in _MULTI_PROCESS_SIGNS.items() if environ.get(name))


def initialize_distributed(cluster: Cluster | None = None, environ=os.environ) -> bool:
    """Calls jax.distributed.initialize() once, with `cluster`'s values or auto-detected, when multi-process."""
    cluster = cluster or Cluster()
    if jax.distributed.is_initialized():
        return True
    if not cluster.given and not is_multi_process(environ):
        return False
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes (tests, one-machine runs)
    jax.distributed.initialize(cluster.coordinator_address, cluster.num_processes, cluster.process_id,
                               heartbeat_timeout_seconds=cluster.heartbeat_timeout_s)
    return True


def host_local_batch_to_global(batch: np.ndarray, mesh, rules: Rules) -> jax.Array:
    """Assembles each process's rows of a [B, T] batch into one global, sharded jax.Array."""
    global_shape = (batch.shape[0] * jax.process_count(), *batch.shape[1:])
    sharding = batch_sharding(mesh, rules, global_shape)
    return jax.make_array_from_process_local_data(sharding, batch, global_shape)
