"""Paths for run outputs: local folders or cloud storage (`gs://bucket/run`), through `etils.epath`;
small state files written atomically, and the free-space check made before a run's first step."""

import errno
import os
import shutil
import uuid

from etils import epath

from freeatten_jax.errors import UserError

FULL_OR_READ_ONLY = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}


class StorageError(UserError, OSError):
    """The workdir is not a writable folder, or its file system is full."""


def path(p) -> epath.Path:
    """An epath.Path; a local path is made absolute (orbax needs it), a URL (`gs://...`) is kept as it is."""
    if isinstance(p, epath.Path) or "://" in str(p):
        return epath.Path(p)
    return epath.Path(os.path.abspath(os.path.expanduser(os.fspath(p))))


def is_local(p) -> bool:
    return "://" not in str(p)


def write_atomic(target, text: str) -> None:
    """Writes `text` to a temporary file beside `target`, then renames it over `target`: a reader (or a rerun after a
    crash) sees the old file or the new one, never a torn one. Cloud objects are replaced whole by any write."""
    target = path(target)
    if not is_local(target):
        target.write_text(text)
        return
    temporary = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex}"
    try:
        with open(temporary, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _nearest_existing(folder: str) -> str:
    while not os.path.lexists(folder):
        folder = os.path.dirname(folder)
    return folder


def check_workdir(workdir) -> None:
    """A local workdir must be a folder, or creatable in a writable one (checked before anything is written)."""
    if not is_local(workdir):
        return
    folder = os.fspath(path(workdir))
    existing = _nearest_existing(folder)
    if not os.path.isdir(existing):
        what = "a file" if os.path.isfile(existing) else "not a folder"
        raise StorageError(f"--workdir={workdir}: {existing} is {what}; give a folder (existing or to be created)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise StorageError(f"--workdir={workdir}: {existing} is not writable; use another --workdir")


def check_free_space(folder, checkpoint_bytes: int) -> None:
    """Refuses to start when the file system holding `folder` cannot take one more checkpoint (local folders)."""
    if not is_local(folder):
        return
    free = shutil.disk_usage(_nearest_existing(os.fspath(path(folder)))).free
    if free < checkpoint_bytes * 1.1:
        raise StorageError(
            f"{folder} has {free / 2**20:.1f} MiB free but a checkpoint of this run takes about "
            f"{checkpoint_bytes / 2**20:.1f} MiB; free space or use another --workdir (nothing was trained)"
        )
