"""Paths for run outputs: local folders or cloud storage (`gs://bucket/run`), through `etils.epath`."""
import os

from etils import epath


def path(p) -> epath.Path:
    """An epath.Path; a local path is made absolute (orbax needs it), a URL (`gs://...`) is kept as it is."""
    if isinstance(p, epath.Path) or "://" in str(p):
        return epath.Path(p)
    return epath.Path(os.path.abspath(os.path.expanduser(os.fspath(p))))
