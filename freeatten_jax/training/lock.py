"""One owner per run folder: process 0 holds an exclusive `fcntl.flock` on WORKDIR/lock while it trains.

The kernel releases the lock when the process exits or crashes, so a stale lock cannot block a rerun.
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
def hold(workdir):
    """Holds WORKDIR/lock for the body; raises WorkdirBusyError naming the holder's pid and host if it is taken."""
    path = storage.path(workdir)
    if jax.process_index() != 0:
        yield
        return
    if "://" in str(path):
        logging.warning("%s is not a local folder: it cannot be locked; make sure no other run uses it", path)
        yield
        return
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise WorkdirBusyError(f"{path} is in use by {holder}; wait for it, stop it, or use another --workdir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
