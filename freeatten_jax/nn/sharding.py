"""One mesh ('data', 'fsdp', 'tensor', 'context') and logical-axis rules: sharding by configuration alone.

Parameters carry logical axis names (`freeatten_jax.params`); `rules` map each name to mesh
axes, e.g. ('embed', 'fsdp'), ('heads', 'tensor'), ('batch', ('data', 'fsdp')). A mesh axis that
does not divide a dimension, or has size 1, is dropped for that dimension (it is replicated), so GQA
with fewer key/value heads than 'tensor' devices, or an odd vocabulary of 50,257, still shards the rest.
Activations are constrained at block boundaries only inside `use_mesh(mesh, rules)`; there, when
'act_length' maps to a mesh axis of size > 1 ('context'), attention runs context-parallel (`context_parallelism`),
and when 'cache_length' does, a KV cache's slots are split over it (a prefill goes round the ring, each decoding
step attends to every device's own slots).
"""

import contextlib
import contextvars
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from freeatten_jax.attention.mesh_axes import BATCH, CHUNKS_PER_DEVICE, CONTEXT, FSDP, MESH, TENSOR
from freeatten_jax.nn.params import logical_names

MESH_AXES = MESH  # a shape of 3 entries leaves 'context' at 1
Rules = Sequence[tuple[str, str | tuple[str, ...] | None]]
DEFAULT_RULES: Rules = (  # pure data parallel over ('data', 'fsdp'); FSDP and tensor axes used when sized > 1
    ("batch", BATCH),  # inputs [B, T]
    ("length", CONTEXT),
    ("act_batch", BATCH),  # activations at block boundaries [B, T, E]
    ("act_length", CONTEXT),  # sequence (context) parallelism: attention goes round a ring
    ("cache_length", CONTEXT),  # a KV cache's slots: each device attends to its own (attention.sharded_decode_attend)
    ("act_embed", None),
    ("act_vocab", TENSOR),
    ("vocab", TENSOR),  # parameters
    ("embed", FSDP),
    ("heads", TENSOR),
    ("kv_heads", TENSOR),
    ("head_dim", None),
    ("mlp", TENSOR),
)
_ACTIVE_RULES: contextvars.ContextVar[Rules | None] = contextvars.ContextVar("rules", default=None)


def mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
    """Fills the one -1 entry so that the product equals num_devices; a missing 'context' entry is 1."""
    shape = tuple(int(n) for n in shape)
    shape += (1,) * (len(shape) == len(MESH_AXES) - 1)
    known = math.prod(n for n in shape if n != -1)
    if len(shape) != len(MESH_AXES) or shape.count(-1) > 1 or known <= 0 or num_devices % known:
        raise ValueError(f"mesh.shape {shape} must give {MESH_AXES} with at most one -1 and divide {num_devices} devices")
    filled = tuple(num_devices // known if n == -1 else n for n in shape)
    if math.prod(filled) != num_devices:
        raise ValueError(f"mesh.shape {shape} covers {math.prod(filled)} devices, but there are {num_devices}")
    return filled


def make_mesh(shape: Sequence[int] = (-1, 1, 1), devices=None, slices: int = 1) -> jax.sharding.Mesh:
    """The ('data', 'fsdp', 'tensor', 'context') mesh of `shape` (-1 fills; Auto axes: XLA propagates). With `slices`
    > 1, 'data' spans that many TPU slices (over DCN) and every other axis stays inside a slice, as MaxText's
    `dcn_data_parallelism`: only the gradient reduction crosses slices, the ring's rotations never do."""
    devices = jax.devices() if devices is None else devices
    shape = mesh_shape(shape, len(devices))
    if shape[0] % slices:
        raise ValueError(f"mesh.shape {shape}: its 'data' size {shape[0]} must be a multiple of mesh.slices={slices}")
    granules = _slices(devices, slices)
    axis_types = (AxisType.Auto,) * len(MESH_AXES)
    if slices == 1:
        return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types, devices=devices)
    per_slice = (shape[0] // slices, *shape[1:])
    grid = np.concatenate([mesh_utils.create_device_mesh(per_slice, granule) for granule in granules])
    return jax.sharding.Mesh(grid, MESH_AXES, axis_types=axis_types)


def _slices(devices, slices: int) -> list[list]:
    """The devices of each slice (by `slice_index`); devices without one (CPU, one GPU node) split in `slices`
    consecutive groups, so the same mesh can be built and tested on host devices."""
    if not hasattr(devices[0], "slice_index"):
        size = len(devices) // slices
        return [list(devices[i * size : (i + 1) * size]) for i in range(slices)]
    by_slice: dict[int, list] = {}
    for device in devices:
        by_slice.setdefault(device.slice_index, []).append(device)
    if len(by_slice) != slices:
        raise ValueError(
            f"mesh.slices={slices}, but the {len(devices)} devices are in {len(by_slice)} slices: set mesh.slices={len(by_slice)}"
        )
    return [by_slice[index] for index in sorted(by_slice)]


def logical_spec(names: Sequence[str | None], shape: Sequence[int], mesh, rules: Rules) -> PartitionSpec:
    """PartitionSpec for an array whose axes have logical `names` (None = replicated)."""
    table = dict(rules)
    missing = [name for name in names if name is not None and name not in table]
    if missing:
        raise ValueError(f"no sharding rule for logical axes {missing}; rules cover: {sorted(table)}")
    used, spec = set(), []
    for name, dim in zip(names, shape):
        target = table.get(name) if name is not None else None
        axes = [a for a in ((target,) if isinstance(target, str) else tuple(target or ())) if a not in used and mesh.shape[a] > 1]
        while axes and dim % math.prod(mesh.shape[a] for a in axes):
            axes.pop()
        used.update(axes)
        spec.append(tuple(axes) if len(axes) > 1 else (axes[0] if axes else None))
    return PartitionSpec(*spec)


def state_shardings(state, mesh, rules: Rules):
    """NamedShardings for a pytree of nnx Variables (model or optimizer state) and plain arrays: each
    variable by its logical names, any other leaf (a step counter) replicated."""

    def sharding(x):
        if not isinstance(x, nnx.Variable):
            return NamedSharding(mesh, PartitionSpec())
        names = logical_names(x) or (None,) * len(x.shape)
        return x.replace(NamedSharding(mesh, logical_spec(names, x.shape, mesh, rules)))

    return jax.tree.map(sharding, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def abstract(make: Callable[[], Any], mesh, rules: Rules):
    """(ShapeDtypeStructs of make()'s pytree carrying their shardings, the shardings): a restore
    target for orbax, or out_shardings for creating it; nothing is allocated."""
    shapes = jax.eval_shape(make)
    shardings = state_shardings(shapes, mesh, rules)
    to_struct = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
    return jax.tree.map(to_struct, shapes, shardings), shardings


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


def active_spec(names: Sequence[str | None], shape: Sequence[int]) -> PartitionSpec | None:
    """The PartitionSpec of an array of `shape` with logical `names` under `use_mesh`; None elsewhere."""
    rules, mesh = _ACTIVE_RULES.get(), jax.sharding.get_abstract_mesh()
    return None if rules is None or mesh.empty else logical_spec(names, shape, mesh, rules)


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """with_sharding_constraint by logical names under `use_mesh`; the identity elsewhere."""
    spec = active_spec(names, x.shape)
    return x if spec is None else jax.lax.with_sharding_constraint(x, spec)


def context_parallelism(shape_BTH: Sequence[int], kv_heads: int, length_axis: str = "act_length") -> dict | None:
    """The mesh arguments of `attention.context_parallel_attend` and `attention.sharded_decode_attend` (mesh,
    axis_name, batch_axis, head_axis) for a sequence of `shape_BTH` when, under `use_mesh`, the rule of its logical
    axis (`length_axis`: 'act_length' for activations, 'cache_length' for a KV cache's slots, None where the rules
    name none) shards it; else None."""
    rules, mesh = _ACTIVE_RULES.get(), jax.sharding.get_abstract_mesh()
    if rules is None or mesh.empty or length_axis not in dict(rules):
        return None
    batch, length, heads = logical_spec(("act_batch", length_axis, "heads"), shape_BTH, mesh, rules)
    if length is None:
        return None
    if not isinstance(length, str):
        raise ValueError(f"rule {length_axis!r} shards the sequence over {length}: context parallelism takes one mesh axis")
    same_kv = logical_spec(("act_batch", length_axis, "kv_heads"), (*shape_BTH[:2], kv_heads), mesh, rules)[2] == heads
    return dict(mesh=mesh, axis_name=length, batch_axis=batch, head_axis=heads if same_kv else None)


def cache_axis() -> str | None:
    """The mesh axis (of size > 1) over which 'cache_length' splits a KV cache's slots under `use_mesh`, else None."""
    rules, mesh = _ACTIVE_RULES.get(), jax.sharding.get_abstract_mesh()
    axis = None if rules is None or mesh.empty else dict(rules).get("cache_length")
    return axis if isinstance(axis, str) and mesh.shape[axis] > 1 else None


def cache_chunks() -> int:
    """What a KV cache's slot count, and a prefill through the ring, must be a multiple of under `use_mesh`: 2n where
    'cache_length' shards the slots over an axis of n devices (the ring's zig-zag chunks), else 1."""
    axis = cache_axis()
    return 1 if axis is None else CHUNKS_PER_DEVICE * jax.sharding.get_abstract_mesh().shape[axis]
