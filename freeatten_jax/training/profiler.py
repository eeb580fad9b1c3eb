"""A jax.profiler trace of training steps [first, last] (train.profile_steps) into WORKDIR/profile, for TensorBoard's
profile tab."""

import jax

from freeatten_jax.training import storage


class Profiler:
    def __init__(self, steps: tuple[int, ...], workdir):
        self.first, self.last = steps or (0, -1)
        self.dir, self.running = str(storage.path(workdir) / "profile"), False

    def before(self, step: int) -> None:
        if step == self.first:
            jax.profiler.start_trace(self.dir)
            self.running = True

    def after(self, step: int, outputs) -> None:
        if self.running and step >= self.last:
            jax.block_until_ready(outputs)
            jax.profiler.stop_trace()
            self.running = False
