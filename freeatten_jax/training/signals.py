"""Preemption: SIGTERM or SIGINT asks the run to save and stop at the end of its step (every process, if any got
it); a second SIGINT interrupts at once. The handler only records: a handler that prints could interrupt a print."""

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
        self.requested, self.name = True, signal.Signals(signum).name

    def any_process(self) -> bool:
        if jax.process_count() == 1:
            return self.requested
        return bool(multihost_utils.process_allgather(np.array(self.requested)).any())

    def restore(self):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
