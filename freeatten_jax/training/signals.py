"""Preemption: SIGTERM or SIGINT asks the run to save and stop at the end of its step (every process, if any got
it); a second SIGINT interrupts at once. The handler records, and says so with one os.write (a handler that prints
through sys.stderr could interrupt a print)."""

import os
import signal

import jax
import numpy as np
from jax.experimental import multihost_utils


class StopSignal:
    def __init__(self):
        self.requested, self.name = False, "a signal to another process"
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if not self.requested:
            os.write(2, f"\n{signal.Signals(signum).name}: stopping after this step (Ctrl-C again: at once, unsaved)\n".encode())
        self.requested, self.name = True, signal.Signals(signum).name

    def any_process(self) -> bool:
        if jax.process_count() == 1:
            return self.requested
        return bool(multihost_utils.process_allgather(np.array(self.requested)).any())

    def restore(self):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
