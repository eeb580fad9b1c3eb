"""The loss-spike rule: a run diverges when its loss stays above `factor` x the running median of recent losses, and
at least MIN_RISE nats above it, for `steps` steps in a row (finite blow-ups: NaN/Inf are caught apart). Spiking
losses stay out of the median. The floor keeps a solved task's losses near 0 (MQAR: 0.003 -> 0.04) from counting."""

import collections
import statistics

WINDOW = 100  # losses in the running median
WARMUP = 5  # losses seen before the rule applies (a resume seeds them from metrics.jsonl)
MIN_RISE = 1.0  # nats: a spike is also this far above the median


class SpikeRule:
    def __init__(self, factor: float, steps: int, history=()):
        """`history`: the losses logged before a resume, so that the rule applies from its first step."""
        self.factor, self.steps = factor, steps
        self.history = collections.deque(history, maxlen=WINDOW)
        self.first_spike, self.run = None, 0  # the step where the current run of spikes began, and its length

    def threshold(self) -> float:
        if not self.factor or len(self.history) < WARMUP:
            return float("inf")
        median = statistics.median(self.history)
        return max(self.factor * median, median + MIN_RISE)

    def observe(self, step: int, loss: float) -> bool:
        """Records a step's loss; True when it is above the threshold (the step's checkpoint is not confirmed)."""
        if loss > self.threshold():
            self.first_spike, self.run = (self.first_spike if self.run else step), self.run + 1
            return True
        self.history.append(loss)
        self.run = 0
        return False

    @property
    def diverged(self) -> bool:
        return self.run >= self.steps
