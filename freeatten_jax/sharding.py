"""One mesh ('data', 'fsdp', 'tensor') and logical-axis rules: sharding by configuration alone.

Parameters carry logical axis names (`freeatten_jax.params`); `rules` map each name to mesh
axes, e.g. ('embed', 'fsdp'), ('heads', 'tensor'), ('batch', ('data', 'fsdp')). A mesh axis that
does not divide a dimension is dropped for that dimension (it is replicated), so GQA with fewer
key/value heads than 'tensor' devices, or an odd vocabulary of 50,257, still shards the rest.
Activations are constrained at block boundaries only inside `use_mesh(mesh, rules)`.
"""
import contextlib
import contextvars
import math
import os
from typing import Callable, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from freeatten_jax.params import logical_names

MESH_AXES = ("data", "fsdp", "tensor")
Rules = Sequence[tuple[str, str | tuple[str, ...] | None]]
_ACTIVE_RULES: contextvars.ContextVar[Rules | None] = contextvars.ContextVar("rules", default=None)


def mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
    """Fills the one -1 entry so that the product equals num_devices."""
    shape = tuple(int(n) for n in shape)
    known = math.prod(n for n in shape if n != -1)
    if len(shape) != len(MESH_AXES) or shape.count(-1) > 1 or known <= 0 or num_devices % known:
        raise ValueError(f"mesh.shape {shape} must give {MESH_AXES} with at most one -1 and divide {num_devices} devices")
    filled = tuple(num_devices // known if n == -1 else n for n in shape)
    if math.prod(filled) != num_devices:
        raise ValueError(f"mesh.shape {shape} covers {math.prod(filled)} devices, but there are {num_devices}")
    return filled


def make_mesh(cfg_mesh, devices=None) -> jax.sharding.Mesh:
    """The ('data', 'fsdp', 'tensor') mesh sized by cfg_mesh.shape (Auto axes: XLA propagates)."""
    devices = jax.devices() if devices is None else devices
    shape = mesh_shape(cfg_mesh.shape, len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


def logical_spec(names: Sequence[str | None], shape: Sequence[int], mesh, rules: Rules) -> PartitionSpec:
    """PartitionSpec for an array whose axes have logical `names` (None = replicated)."""
    table = dict(rules)
    missing = [name for name in names if name is not None and name not in table]
    if missing:
        raise ValueError(f"no sharding rule for logical axes {missing}; rules cover: {sorted(table)}")
    used, spec = set(), []
    for name, dim in zip(names, shape):
        target = table.get(name) if name is not None else None
        axes = [a for a in ((target,) if isinstance(target, str) else tuple(target or ())) if a not in used]
        while axes and dim % math.prod(mesh.shape[a] for a in axes):
            axes.pop()
        used.update(axes)
        spec.append(tuple(axes) if len(axes) > 1 else (axes[0] if axes else None))
    return PartitionSpec(*spec)


def state_shardings(state, mesh, rules: Rules):
    """NamedShardings for an nnx.State (model or optimizer): the variables' logical names, resolved."""

    def sharding(variable):
        names = logical_names(variable) or (None,) * len(variable.shape)
        return variable.replace(NamedSharding(mesh, logical_spec(names, variable.shape, mesh, rules)))

    return jax.tree.map(sharding, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def abstract_state(build: Callable[[], nnx.Module], mesh, rules: Rules):
    """(graphdef, state of ShapeDtypeStructs with their shardings): a restore target for orbax."""
    graphdef, state = nnx.split(nnx.eval_shape(build))
    shardings = state_shardings(state, mesh, rules)
    to_struct = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
    return graphdef, jax.tree.map(to_struct, state, shardings)


def build_sharded(build: Callable[[], nnx.Module], mesh, rules: Rules) -> nnx.Module:
    """Runs `build` (e.g. lambda: Transformer(cfg, rngs=nnx.Rngs(0))) with every array created
    directly in its sharding: no device ever holds the whole model."""
    graphdef, state = nnx.split(nnx.eval_shape(build))
    init = jax.jit(lambda: nnx.state(build()), out_shardings=state_shardings(state, mesh, rules))
    with jax.set_mesh(mesh):
        return nnx.merge(graphdef, init())


def batch_sharding(mesh, rules: Rules, shape: Sequence[int]) -> NamedSharding:
    """Sharding of a [B, T] input batch (logical axes 'batch', 'length')."""
    return NamedSharding(mesh, logical_spec(("batch", "length"), shape, mesh, rules))


@contextlib.contextmanager
def use_mesh(mesh, rules: Rules):
    """Sets the mesh and activates the rules for `constrain` (trace jitted steps inside)."""
    token = _ACTIVE_RULES.set(tuple(rules))
    try:
        with jax.set_mesh(mesh):
            yield mesh
    finally:
        _ACTIVE_RULES.reset(token)


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """with_sharding_constraint by logical names under `use_mesh`; the identity elsewhere."""
    rules, mesh = _ACTIVE_RULES.get(), jax.sharding.get_abstract_mesh()
    if rules is None or mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_spec(names, x.shape, mesh, rules))


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
