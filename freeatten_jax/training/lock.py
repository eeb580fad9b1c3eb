"""One owner per run folder: process 0 holds an exclusive `fcntl.flock` on WORKDIR/lock while it trains.

The holder removes the file as it exits; the kernel releases the lock when the process exits or crashes, so a file
left by a crash cannot block a rerun.
Cloud workdirs (`gs://...`) have no advisory locks: they are not locked (a warning says so).
"""

import contextlib
import fcntl
import os
import socket

import jax
from absl import logging

from freeatten_jax.errors import UserError
from freeatten_jax.training import storage


class WorkdirBusyError(UserError, RuntimeError):
    """Another process is training in the same workdir."""


@contextlib.contextmanager
def hold(workdir, flag: str = "--workdir"):
    """Holds WORKDIR/lock for the body; raises WorkdirBusyError naming the holder's pid and host if it is taken (and
    `flag`, the command's option naming the folder)."""
    path = storage.path(workdir)
    if jax.process_index() != 0:
        yield
        return
    if "://" in str(path):
        logging.warning("%s is not a local folder: it cannot be locked; make sure no other run uses it", path)
        yield
        return
    path.mkdir(parents=True, exist_ok=True)
    fd = _locked(path / "lock", path, flag)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path / "lock")  # still held: whoever opened the file meanwhile finds it gone and opens the next one
        os.close(fd)  # releases the lock


def _locked(lock_path, workdir, flag: str) -> int:
    """An open fd of `lock_path` holding its exclusive flock: of the file there now, not one its holder removed while
    this process opened it."""
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise WorkdirBusyError(f"{workdir} is in use by {holder}; wait for it, stop it, or use another {flag}") from None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(lock_path).st_ino == os.fstat(fd).st_ino:
                return fd
        os.close(fd)
