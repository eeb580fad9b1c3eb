"""Fingerprints that let a restore prove what it read: of every array of the train state (computed on the
devices, where the arrays live: two wrapping uint32 sums over each array's bits, exact for any sharding), of the
data iterator's state (each process's), and of the training data files (paths, sizes, a hash of samples)."""

import functools
import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}
_SAMPLE = 1 << 14  # bytes hashed at the start, middle and end of each data file


def bits_sums(x) -> jax.Array:
    """uint32[2]: sum(bits * odd(index)) and sum((bits ^ index') * odd), wrapping; changing any element changes the first."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    bits = jax.lax.bitcast_convert_type(x, _UINT[x.dtype.itemsize]).astype(jnp.uint32)
    index, stride = jnp.zeros(x.shape, jnp.uint32), 1
    for axis in reversed(range(x.ndim)):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis) * jnp.uint32(stride % (1 << 32))
        stride *= x.shape[axis]
    odd = index * jnp.uint32(0x9E3779B1) | jnp.uint32(1)
    mixed = (bits ^ (index * jnp.uint32(0x85EBCA77))) * jnp.uint32(0xC2B2AE3D)
    return jnp.stack([jnp.sum(bits * odd, dtype=jnp.uint32), jnp.sum(mixed, dtype=jnp.uint32)])


@functools.cache
def _fingerprint_program(replicated):
    """The jitted map [arrays] -> uint32[n, 2], one per output sharding (traced once per state structure)."""
    return jax.jit(lambda xs: jnp.stack([bits_sums(x) for x in xs]), out_shardings=replicated)


def arrays(tree) -> dict[str, str]:
    """{pytree path: 16 hex digits} of every array leaf, computed where the arrays are (one small program)."""
    paths, leaves = zip(*jax.tree_util.tree_flatten_with_path(tree)[0])
    mesh = next((x.sharding.mesh for x in leaves if isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding)), None)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()) if mesh is not None else None
    sums = _fingerprint_program(replicated)(list(leaves))
    sums = np.asarray(multihost_utils.process_allgather(sums, tiled=True) if jax.process_count() > 1 else sums)
    return {jax.tree_util.keystr(p): f"{int(a):08x}{int(b):08x}" for p, (a, b) in zip(paths, sums.reshape(len(paths), 2))}


def iterator(data_iterator) -> list[str]:
    """Each process's sha256 (first 16 hex digits) of its data iterator's state, in process order."""
    state = json.dumps(data_iterator.get_state(), sort_keys=True, default=str).encode()
    mine = np.frombuffer(hashlib.sha256(state).digest()[:8], np.uint32)
    every = np.asarray(multihost_utils.process_allgather(mine) if jax.process_count() > 1 else mine[None]).reshape(-1, 2)
    return [f"{int(a):08x}{int(b):08x}" for a, b in every]


def files(paths) -> list[list]:
    """[path, size, sha256 of samples at the start, middle and end] of each data file (epath or local paths)."""
    out = []
    for path in paths:
        size = path.stat().st_size
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for offset in sorted({0, max(size // 2 - _SAMPLE // 2, 0), max(size - _SAMPLE, 0)}):
                f.seek(offset)
                digest.update(f.read(_SAMPLE))
        out.append([str(path), size, digest.hexdigest()[:16]])
    return out


def files_changed(saved: list[list], now: list[list]) -> str | None:
    """The first difference between two `files` fingerprints, in words (None when equal)."""
    old, new = {p: (s, h) for p, s, h in saved}, {p: (s, h) for p, s, h in now}
    for path in sorted(set(old) | set(new)):
        if path not in new:
            return f"{path} is gone"
        if path not in old:
            return f"{path} is new"
        (s0, h0), (s1, h1) = old[path], new[path]
        if s0 != s1:
            return f"{path} was {s0} bytes, now {s1}"
        if h0 != h1:
            return f"{path} has other contents (same size, {s1} bytes)"
    return None
