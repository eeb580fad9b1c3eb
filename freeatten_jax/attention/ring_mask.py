"""Where a device sits on the context-parallel ring: its queries' mask, every chunk's key-side mask, and the
rotation that passes chunks on (the blockwise ring, ring.py, and the kernels' ring, pallas/ring.py).

Glossary: B batch, T queries, S keys, n the ring (context axis) size.
"""

import dataclasses
import functools

import jax

from freeatten_jax.attention.variants import Mask

KV_FIELDS = ("kv_positions", "kv_segment_ids", "kv_valid")  # a Mask's key-side arrays


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["q_mask", "kv_masks", "n_BHT"], meta_fields=["axis_name", "size"]
)
@dataclasses.dataclass(frozen=True)
class Ring:
    """Where a device sits on the ring, and the key-side mask of every device's chunk."""

    axis_name: str
    size: int  # static: the number of ring steps (the context axis size n, or 1 when K/V are all-gathered)
    q_mask: Mask  # q arrays [B, T/n] (this device's queries), kv arrays unused
    kv_masks: tuple  # the KV_FIELDS arrays of every device's chunk, each [size, B, S/size], indexed by device
    n_BHT: jax.Array  # N_i of this device's queries, counted over every key (int32 [B, 1, T/n])

    @classmethod
    def around(cls, mask: Mask, n_BHT, axis_name: str, size: int) -> "Ring":
        """Inside shard_map: the ring of this device's mask arrays and N_i (key-side arrays all-gathered)."""
        kv_masks = tuple(jax.lax.all_gather(getattr(mask, name), axis_name) for name in KV_FIELDS)
        return cls(axis_name=axis_name, size=size, q_mask=mask, kv_masks=kv_masks, n_BHT=n_BHT)

    def mask_at(self, step) -> Mask:
        """The mask of this device's queries against the chunk it holds at ring step `step`."""
        source = (jax.lax.axis_index(self.axis_name) - step) % self.size
        return dataclasses.replace(self.q_mask, **{name: x[source] for name, x in zip(KV_FIELDS, self.kv_masks)})


def rotate(tree, axis_name: str, size: int):
    """Send every array to the next device on the ring (nothing to send on a ring of one: K/V gathered)."""
    if size == 1:
        return tree
    return jax.lax.ppermute(tree, axis_name, [(d, (d + 1) % size) for d in range(size)])
