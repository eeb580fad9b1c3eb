"""llm.c / modded-nanogpt token shards: a 256 x int32 header (magic, version, count), then uint16 tokens."""

import os
import pathlib

import numpy as np

from freeatten_jax.data.watch import changed
from freeatten_jax.errors import UserError

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4


class ShardError(UserError, ValueError):
    """A file is not a valid .bin token shard."""


def write_shard(path, tokens) -> None:
    """Writes 1-D tokens (each < 65536) as a .bin shard."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or (tokens.size and (tokens.min() < 0 or tokens.max() > np.iinfo(np.uint16).max)):
        raise ValueError("tokens must be a 1-D array of values in [0, 65535]")
    header = np.zeros(HEADER_INTS, np.int32)
    header[:3] = MAGIC, VERSION, tokens.size
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())


def read_header(path) -> int:
    """Validates a shard's header and size; returns its token count."""
    path = pathlib.Path(path)
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(HEADER_BYTES), "<i4")
    if header.size != HEADER_INTS or header[0] != MAGIC:
        raise ShardError(f"{path}: not a .bin token shard (expected a 256 x int32 header starting with magic {MAGIC})")
    if header[1] != VERSION:
        raise ShardError(f"{path}: unsupported shard version {header[1]} (supported: {VERSION})")
    count, size = int(header[2]), path.stat().st_size
    if size != HEADER_BYTES + 2 * count:
        raise ShardError(f"{path}: header says {count} tokens ({HEADER_BYTES + 2 * count} bytes) but the file has {size} bytes")
    return count


class Shard:
    """A [start, stop) slice of a shard's tokens, read with pread (cheap to pickle into workers).

    Not memory-mapped: a file truncated under a running trainer would kill it with SIGBUS; here a read that
    finds the file's size changed raises watch.DataChangedError, one line, as the loop's FileWatch does."""

    def __init__(self, path, start: int = 0, stop: int | None = None):
        self.path = str(path)
        count = read_header(path)
        self.start, self.stop = start, count if stop is None else stop
        self.file_size = HEADER_BYTES + 2 * count
        self._fd = None

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, index: slice) -> np.ndarray:
        start, stop, step = index.indices(len(self))
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        count = max(stop - start, 0)
        raw = os.pread(self._fd, 2 * count, HEADER_BYTES + 2 * (self.start + start))
        if len(raw) != 2 * count or os.fstat(self._fd).st_size != self.file_size:
            raise changed(self.path, f"it was {self.file_size} bytes, now {os.fstat(self._fd).st_size}")
        return np.frombuffer(raw, "<u2")[::step]

    def __getstate__(self):
        return {**self.__dict__, "_fd": None}
