"""Preemption: SIGTERM or SIGINT asks the run to save and stop at the end of its step (every process, if any got
it), or, during start-up, to stop at its next check (`StopSignal.check`: before the lock, after the resume, before
the first step) with nothing to save; a second SIGINT interrupts at once. The handler records, and says so with one
os.write (a handler that prints through sys.stderr could interrupt a print). `stopping` installs the handlers once
per process: freeatten-train (cli/scripts.py) does so before it imports the command, and the run takes them over."""

import contextlib
import os
import signal

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StoppedStarting(Exception):
    """A signal came during start-up: the run stopped at a check before its first step (nothing new to save)."""


class StopSignal:
    def __init__(self, until: str = "after this step"):
        self.requested, self.name, self.until = False, "a signal to another process", until
        self._previous = {s: signal.getsignal(s) for s in _SIGNALS}
        self.take_back()

    def take_back(self) -> None:
        """Installs the handlers (again: jax.distributed.initialize puts its preemption notifier's over SIGTERM's)."""
        for s in _SIGNALS:
            signal.signal(s, self._handle)

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if not self.requested:
            os.write(2, f"\n{signal.Signals(signum).name}: stopping {self.until} (Ctrl-C again: at once, unsaved)\n".encode())
        self.requested, self.name = True, signal.Signals(signum).name

    def any_process(self) -> bool:
        import jax  # here, not at import: the train command installs its handlers before it imports jax

        if jax.process_count() == 1:
            return self.requested
        import numpy as np
        from jax.experimental import multihost_utils

        return bool(multihost_utils.process_allgather(np.array(self.requested)).any())

    def check(self) -> None:
        """A check of start-up (every process calls it at the same points): raises StoppedStarting if any got a signal."""
        if self.any_process():
            raise StoppedStarting(self.name)

    def restore(self):
        for s, handler in self._previous.items():
            signal.signal(s, handler)


_held: list[StopSignal] = []  # the process's StopSignal while `stopping` holds it


@contextlib.contextmanager
def stopping():
    """The process's StopSignal for the body (its message: stopping before training starts): installed on entry unless
    an enclosing `stopping` holds one already, whose signals so far it keeps; restored by the one that installed it."""
    if _held:
        yield _held[0]
        return
    _held.append(StopSignal(until="before training starts"))
    try:
        yield _held[0]
    finally:
        _held.pop().restore()
