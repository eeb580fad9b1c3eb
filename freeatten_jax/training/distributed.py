"""Multi-process start-up and input assembly: one JAX process per host (TPU slice, SLURM, MPI, or given by hand).

`Cluster` holds the command line's --coordinator_address / --num_processes / --process_id; fields left None are
auto-detected by jax.distributed.initialize on TPU/GPU clusters. On CPU the processes talk over gloo.
`PeerWatch` stops a process whose peer died (a collective would wait for it forever) within `peer_timeout_s`, in one
line. jax's own heartbeat is only the backstop, for a process whose PeerWatch cannot run: it aborts (SIGABRT,
"Terminating process because the JAX distributed service detected fatal errors", a stack trace), so it must not come
first. Its clients beat every heartbeat timeout / 2, so its service flags a dead process between half the timeout
and the whole of it after the death: `heartbeat_timeout_s` keeps that half well above PeerWatch's peer_timeout_s + 2
polls. (jax's missed-heartbeat hook cannot print our line instead: a Python callback there dies in std::bad_cast in
jaxlib 0.10.)
"""

import dataclasses
import os
import sys
import threading
import time

import jax
import numpy as np

from freeatten_jax.errors import EXIT_PEER_LOST, ConfigError
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
    peer_timeout_s: int = 60  # a process that has not heard from a peer for this long stops (PeerWatch)

    def __post_init__(self):
        given = [self.coordinator_address, self.num_processes, self.process_id]
        if any(v is not None for v in given) and any(v is None for v in given):
            raise ConfigError("--coordinator_address, --num_processes and --process_id go together: give all three or none")
        if self.num_processes is not None and not 0 <= self.process_id < self.num_processes:
            raise ConfigError(
                f"--process_id={self.process_id} is invalid; allowed: 0 .. --num_processes - 1 = {self.num_processes - 1}"
            )

    @property
    def given(self) -> bool:
        return self.coordinator_address is not None


def is_multi_process(environ=os.environ) -> bool:
    """True when the environment describes several JAX processes (TPU slice, SLURM, MPI)."""
    return multi_process_sign(environ) is not None


def multi_process_sign(environ=os.environ) -> str | None:
    """`NAME=value` of the first environment variable that describes several JAX processes, else None."""
    for name, sign in _MULTI_PROCESS_SIGNS.items():
        if environ.get(name) and sign(environ[name]):
            return f"{name}={environ[name]}"
    return None


def initialize_distributed(environ=os.environ, cluster: Cluster | None = None) -> bool:
    """Calls jax.distributed.initialize() once, with `cluster`'s values or auto-detected, when multi-process."""
    cluster = cluster or Cluster()
    if jax.distributed.is_initialized():
        return True
    if not cluster.given and not is_multi_process(environ):
        return False
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes (tests, one-machine runs)
    jax.distributed.initialize(
        cluster.coordinator_address,
        cluster.num_processes,
        cluster.process_id,
        heartbeat_timeout_seconds=heartbeat_timeout_s(cluster.peer_timeout_s),
    )
    return True


def heartbeat_timeout_s(peer_timeout_s: int) -> int:
    """jax's heartbeat timeout for a run whose PeerWatch waits `peer_timeout_s`: its service flags a dead process no
    sooner than half of it, 2 x peer_timeout_s + 5 s, well after PeerWatch (peer_timeout_s + 2 polls) has stopped."""
    return 4 * peer_timeout_s + 10


class PeerWatch:
    """While training, each process bumps a counter in the coordination service's key-value store every second and
    reads its peers'; one whose peer's counter stands still for `timeout_s`, whose peer stopped on an error (`failed`:
    it waits for that peer in a collective, else), or that loses the service (process 0 gone), writes one `error:` line
    and exits with EXIT_PEER_LOST. A process that finishes writes `done`."""

    def __init__(self, timeout_s: float, interval_s: float = 1.0):
        from jax._src import distributed as jax_distributed  # the client of jax.distributed.initialize (as orbax uses it)

        self.client, self.timeout_s, self.interval_s = jax_distributed.global_state.client, timeout_s, interval_s
        self.me, self.count = jax.process_index(), jax.process_count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="PeerWatch", daemon=True)
        self._thread.start()

    def _key(self, process: int) -> str:
        return f"freeatten_peer_watch/{process}"

    def _run(self) -> None:
        heard = {p: (None, time.monotonic()) for p in range(self.count) if p != self.me}  # last value, when it changed
        beat = 0
        while not self._stop.wait(self.interval_s):
            beat += 1
            try:
                self.client.key_value_set(self._key(self.me), str(beat), allow_overwrite=True)
                values = {p: self._try_get(p) for p in heard}
            except Exception as e:  # the service runs in process 0
                self._lost(
                    f"lost the coordination service ({str(e).strip().splitlines()[0][:120]}): process 0 died or cannot be reached"
                )
            now = time.monotonic()
            for p, value in values.items():
                if value == "done":
                    continue
                if value == "failed":
                    self._lost(f"process {p} of {self.count} stopped on an error (its own output says which)", farewell=True)
                if value != heard[p][0]:
                    heard[p] = (value, now)
                elif now - heard[p][1] > self.timeout_s:
                    self._lost(f"process {p} of {self.count} has not been heard from for {self.timeout_s:g} s: it died or hangs")

    def _try_get(self, process: int) -> str | None:
        try:
            return self.client.key_value_try_get(self._key(process))
        except Exception as e:
            if "NOT_FOUND" in str(e):
                return None  # not started yet: counted from when this one started
            raise

    def _lost(self, what: str, farewell: bool = False) -> None:
        """Exits with one line. `farewell`: the peer is exiting, waiting in jax's shutdown barrier for this process
        (were it left, its jax client would abort it): join the barrier first, with what the main thread's failing
        collective then says sent to /dev/null."""
        sys.stdout.flush()
        sys.stderr.write(
            f"error: {what}; stopping this process too (exit {EXIT_PEER_LOST}): restart every process to "
            f"resume from the last checkpoint\n"
        )
        sys.stderr.flush()
        if farewell:
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
            jax.distributed.shutdown()
        os._exit(EXIT_PEER_LOST)

    def stop(self, failed: bool = False) -> None:
        """Stops watching, and tells the peers this process finished (not died), or stopped on an error."""
        self._stop.set()
        self._thread.join()
        try:
            self.client.key_value_set(self._key(self.me), "failed" if failed else "done", allow_overwrite=True)
        except Exception:  # the service is gone at the very end: nothing to tell
            pass


def data_shard(mesh, rules: Rules) -> tuple[int, int]:
    """(this process's index, their count) among the distinct blocks of batch rows that the processes' devices hold:
    processes that a 'context' or 'tensor' axis spans hold the same rows (each its part of them), so they read the
    same windows; with the batch axes alone across processes, each process is its own block."""
    target = dict(rules).get("batch")
    axes = [mesh.axis_names.index(a) for a in ((target,) if isinstance(target, str) else tuple(target or ()))]
    rows: dict[int, set] = {}
    for coords in np.ndindex(mesh.devices.shape):
        rows.setdefault(mesh.devices[coords].process_index, set()).add(tuple(coords[a] for a in axes))
    blocks = sorted({frozenset(r) for r in rows.values()}, key=min)
    return blocks.index(frozenset(rows[jax.process_index()])), len(blocks)


def host_local_batch_to_global(batch: np.ndarray, mesh, rules: Rules) -> jax.Array:
    """Assembles each process's rows of a [B, T] batch (its block's: `data_shard`) into one global, sharded jax.Array."""
    global_shape = (batch.shape[0] * data_shard(mesh, rules)[1], *batch.shape[1:])
    sharding = batch_sharding(mesh, rules, global_shape)
    return jax.make_array_from_process_local_data(sharding, batch, global_shape)
