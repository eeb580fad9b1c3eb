"""The mesh axes the library knows by name: what shards the batch, the heads and the sequence (context); the checks of
a sharded attention's mesh arguments."""

import math

import jax

DATA, FSDP, TENSOR, CONTEXT = "data", "fsdp", "tensor", "context"
MESH = (DATA, FSDP, TENSOR, CONTEXT)  # a model mesh's axes, in order
BATCH = (DATA, FSDP)  # the batch is split over both (FSDP shards parameters too)
HEADS = (TENSOR,)
CHUNKS_PER_DEVICE = 2  # context parallelism gives each device two chunks of the sequence (zig-zag load balance)


def context_length_error(name: str, length: int, size: int, axis_name: str = CONTEXT) -> str | None:
    """Why a sequence of `length` cannot be split over a context axis of `size`, or None: the one rule, a multiple
    of CHUNKS_PER_DEVICE x size."""
    if size > 1 and length % (CHUNKS_PER_DEVICE * size):
        return (
            f"{name} {length} must be a multiple of {CHUNKS_PER_DEVICE} x the {axis_name!r} axis size "
            f"({CHUNKS_PER_DEVICE * size}): context parallelism gives each device {CHUNKS_PER_DEVICE} chunks (zig-zag)"
        )
    return None


def check_mesh(mesh, axis_name: str, batch_axis, head_axis, q_shape, k_shape) -> None:
    """The mesh arguments of context_parallel_attend and sharded_decode_attend: a Mesh (or AbstractMesh) with
    `axis_name`; batch_axis and head_axis each None or other axes of it (one, or a tuple), dividing the batch and both
    head counts. A TypeError / ValueError naming the argument, where shard_map would raise in many lines."""
    if not isinstance(mesh, (jax.sharding.Mesh, jax.sharding.AbstractMesh)):
        raise TypeError(f"mesh must be a jax.sharding.Mesh or AbstractMesh, got {type(mesh).__name__}")
    if axis_name not in mesh.shape:
        raise ValueError(f"axis_name {axis_name!r} is not an axis of the mesh {dict(mesh.shape)}")
    others = [a for a in mesh.shape if a != axis_name]
    dims = {"batch_axis": {"batch": q_shape[0]}, "head_axis": {"num_heads": q_shape[2], "num_kv_heads": k_shape[2]}}
    for name, axes in (("batch_axis", batch_axis), ("head_axis", head_axis)):
        names = () if axes is None else tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)
        if any(a not in others for a in names):
            raise ValueError(f"{name} {axes!r} is invalid; allowed: None, or axes of the mesh other than {axis_name!r}: {others}")
        size = math.prod(mesh.shape[a] for a in names)
        for dim, n in dims[name].items():
            if n % size:
                raise ValueError(
                    f"{name} {axes!r} cannot split {dim} {n} over {size} devices; allowed: axes whose size divides it, or None"
                )
