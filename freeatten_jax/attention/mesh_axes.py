"""The mesh axes the library knows by name: what shards the batch, the heads and the sequence (context)."""

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
