"""Parameters that carry logical axis names but never need a mesh to be created.

Each parameter records its logical axes (e.g. ('embed', 'heads', 'head_dim')) as flax
`out_sharding` metadata with eager sharding off, so models build anywhere (one CPU, inside or
outside `jax.set_mesh`); `freeatten_jax.nn.sharding` maps the names to a mesh when asked.
"""

from collections.abc import Callable

import jax
from flax import nnx

Init = Callable[..., jax.Array]  # (key or None for a constant, shape, dtype) -> array


def param(key: jax.Array | None, init: Init, shape: tuple[int, ...], names: tuple[str | None, ...], dtype) -> nnx.Param:
    """A new nnx.Param of `shape`, initialised by `init`, annotated with logical axis `names`."""
    if len(names) != len(shape):
        raise ValueError(f"{len(names)} axis names {names} for a parameter of shape {shape}")
    return nnx.Param(init(key, shape, dtype), out_sharding=tuple(names), eager_sharding=False)


def logical_names(variable: nnx.Variable) -> tuple[str | None, ...] | None:
    """The logical axis names a parameter was created with (None if it has none)."""
    names = variable.get_metadata().get("out_sharding")
    return tuple(names) if names else None
