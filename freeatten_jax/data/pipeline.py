"""Grain pipelines: random training windows of seq_len + 1 tokens, and fixed validation windows.

Glossary: L = seq_len + 1 (inputs plus the shifted target), B per-host batch size.
Each epoch is a seeded shuffle of the chunks [c*L, (c+1)*L) of every sequence; the window for a chunk
starts at a random offset inside it. Element i of the global stream is the same for any number of
hosts; host h takes elements h, h + P, h + 2P, ... so hosts never share a window.
"""

import bisect
import itertools

import grain
import numpy as np


def num_chunks(sequences, length: int) -> int:
    """Training windows of `length` tokens per epoch (each host needs at least one)."""
    return _chunk_offsets(sequences, length)[-1]


def _chunk_offsets(sequences, length: int) -> list[int]:
    """Cumulative chunk counts: sequence k owns global chunks [offsets[k], offsets[k+1])."""
    counts = [max(len(s) - length + 1, 0) // length for s in sequences]
    return [0, *itertools.accumulate(counts)]


class RandomWindow(grain.transforms.RandomMap):
    """Chunk index -> int32 window [L] starting at a random offset inside the chunk."""

    def __init__(self, sequences, length: int):
        self.sequences, self.length = sequences, length
        self.offsets = _chunk_offsets(sequences, length)

    def random_map(self, chunk: int, rng: np.random.Generator) -> np.ndarray:
        k = bisect.bisect_right(self.offsets, chunk) - 1
        start = (chunk - self.offsets[k]) * self.length + int(rng.integers(self.length))
        return self.sequences[k][start : start + self.length].astype(np.int32)


SYNTHETIC_STREAM = 1 << 40  # windows of a synthetic stream (drawn per index, never repeated in practice)


def train_dataset(
    sequences, seq_len: int, batch_size: int, *, seed: int, process_index: int = 0, process_count: int = 1, mix=None, windows=None
):
    """The host's infinite MapDataset of int32 batches [B, seq_len + 1]; `mix(global index, window) -> window`
    (e.g. retrieval.Mix) may replace windows of the global stream; `windows(global index) -> window` (a synthetic
    task, e.g. mqar.Windows) replaces the sequences altogether."""
    length = seq_len + 1
    if windows is not None:
        ds = grain.MapDataset.range(SYNTHETIC_STREAM).map(windows)
    else:
        num_chunks = _chunk_offsets(sequences, length)[-1]
        if num_chunks < process_count:
            total = sum(len(s) for s in sequences)
            raise ValueError(f"training data has {total} tokens: too few for windows of seq_len + 1 = {length} tokens")
        ds = grain.MapDataset.range(num_chunks).seed(seed).shuffle().repeat(None)
        ds = ds.random_map(RandomWindow(sequences, length))
    if mix is not None:
        ds = ds.map_with_index(mix)
    ds = ds[process_index::process_count]
    return ds.batch(batch_size, drop_remainder=True)


def train_iterator(
    sequences,
    seq_len: int,
    batch_size: int,
    *,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    num_workers: int = 0,
    mix=None,
    windows=None,
):
    """A checkpointable iterator (get_state/set_state) over the host's training batches."""
    ds = train_dataset(
        sequences,
        seq_len,
        batch_size,
        seed=seed,
        process_index=process_index,
        process_count=process_count,
        mix=mix,
        windows=windows,
    )
    ds = ds.to_iter_dataset()
    if num_workers:
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
    return iter(ds)


def eval_windows(sequences, length: int, max_windows: int | None = None) -> np.ndarray:
    """Non-overlapping int32 windows [W, length + 1] cut in order from the sequences (inputs and targets)."""
    size = length + 1
    cuts = ((s, i * size) for s in sequences for i in range(len(s) // size))
    windows = [s[i : i + size] for s, i in itertools.islice(cuts, max_windows)]
    if not windows:
        raise ValueError(f"validation data ({sum(len(s) for s in sequences)} tokens) cannot fill one window of {size} tokens")
    return np.stack(windows).astype(np.int32)
