"""Training files that change under a running trainer: each file's size and modification time, by path (a file
replaced, truncated or removed counts), against what they were before the run read them. One stat per file, at most
every MIN_INTERVAL_S (or 20 x what the last check took: cloud stats are slow) and before every checkpoint, so that no
checkpoint holds a step trained on changed data."""

import os
import time

from etils import epath

from freeatten_jax.errors import UserError

MIN_INTERVAL_S = 1.0


class DataChangedError(UserError, ValueError):
    """A training file changed, vanished or became unreadable while the run trained on it."""


def changed(path, what: str) -> DataChangedError:
    """The error (one line) for training file `path` that changed as `what` says; a rerun resumes once it is restored."""
    return DataChangedError(
        f"{path} changed while training ({what}); stopped without saving, every checkpoint is kept: restore the file "
        f"and rerun to resume from the last checkpoint, or rerun with --config.data.allow_changed=True to go on with "
        f"the data as it is now"
    )


def _stamp(path) -> tuple[int, int]:
    """(size, mtime) of a file: mtime in ns for a local file, in s for a cloud one (all its stat gives)."""
    if "://" in str(path):
        stat = epath.Path(path).stat()
        return stat.length, stat.mtime
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


class FileWatch:
    """The stamps of `paths`, taken now; `check` raises DataChangedError for the first file whose stamp differs."""

    def __init__(self, paths):
        self.stamps = {str(p): _stamp(p) for p in paths}
        self.next_check = 0.0

    def check(self, force: bool = False) -> None:
        """Compares every file's stamp with the first (unless the last check was too recent and not `force`)."""
        start = time.monotonic()
        if start < self.next_check and not force:
            return
        for path, (size, mtime) in self.stamps.items():
            try:
                now_size, now_mtime = _stamp(path)
            except FileNotFoundError:
                raise changed(path, "it is gone") from None
            except OSError as e:
                raise changed(path, f"it cannot be read: {e.strerror or e}") from None
            if now_size != size:
                raise changed(path, f"it was {size} bytes, now {now_size}")
            if now_mtime != mtime:
                raise changed(path, f"rewritten: same size, {size} bytes, another modification time")
        self.next_check = time.monotonic() + max(MIN_INTERVAL_S, 20 * (time.monotonic() - start))
