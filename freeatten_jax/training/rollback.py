"""Stopping a run that went wrong without keeping what it spoilt: a NaN/Inf loss or update, or a loss that diverges
(training.divergence), moves the checkpoints that may hold it aside and says where a rerun starts. A checkpoint is
confirmed good once the step after it was seen sound and it is wholly written."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from freeatten_jax.errors import UserError
from freeatten_jax.training import divergence


class NonFiniteLossError(UserError, FloatingPointError):
    """Training produced a NaN or Inf loss or gradient."""


class DivergenceError(UserError, FloatingPointError):
    """The loss stayed above the spike rule's threshold (training.divergence) for train.spike_steps steps."""


def logged_losses(writer) -> list[tuple[int, float]]:
    """(step, loss) of the last losses metrics.jsonl holds up to the resumed step (process 0's, sent to all: the spike
    rule must agree)."""
    steps, losses = np.zeros(divergence.WINDOW, np.int32), np.full(divergence.WINDOW, np.nan, np.float32)
    logged = [(m["step"], m["loss"]) for m in writer.rows if "loss" in m][-divergence.WINDOW :]
    for i, (step, loss) in enumerate(logged):
        steps[i], losses[i] = step, loss
    if jax.process_count() > 1:
        steps, losses = multihost_utils.broadcast_one_to_all((steps, losses))
    return [(int(step), float(x)) for step, x in zip(steps, losses) if np.isfinite(x)]


class Guard:
    """Checks each step's metrics; tracks which checkpoint the next sound step confirms."""

    def __init__(self, t, ckpt, logged: list[tuple[int, float]], start: int):
        """`logged`: a resumed run's logged (step, loss), replayed through the spike rule: a spike still running when
        the last run was stopped (kill -9, preemption) goes on counting from its first step, and stays out of the median."""
        self.t, self.ckpt = t, ckpt
        self.spikes = divergence.SpikeRule(t.spike_factor, t.spike_steps)
        for step, loss in logged:
            self.spikes.observe(step, loss)
        self.unconfirmed = start or None  # the newest checkpoint whose next step has not yet been seen sound
        self.sound = None  # a checkpoint whose next step was sound: confirmed once it is wholly written

    def check(self, step: int, metrics: dict) -> None:
        """Raises (after rolling back) on a non-finite or diverging step; confirms what a sound step follows."""
        threshold, spikes, factor = self.spikes.threshold(), self.spikes, self.t.spike_factor
        if not metrics["finite"]:
            loss, norm = float(metrics["loss"]), float(metrics["grad_norm"])
            first_bad = (spikes.first_spike if spikes.run else step) - 1  # during a spike: the checkpoint before it
            raise rolled_back(NonFiniteLossError, self.ckpt, first_bad, f"step {step}: loss {loss}, grad norm {norm}: not finite")
        if spikes.observe(step, float(metrics["loss"])) and spikes.diverged:
            raise rolled_back(
                DivergenceError,
                self.ckpt,
                spikes.first_spike - 1,
                f"step {step}: loss {float(metrics['loss']):.4g} has been above {factor:g} x its running "
                f"median ({threshold / factor:.4g}) for {spikes.run} steps (since step {spikes.first_spike}): diverging",
                "lower optim.lr, or set train.spike_factor=0 to stop only on NaN/Inf",
            )
        if self.unconfirmed is not None and self.unconfirmed < step and spikes.run == 0:
            self.sound, self.unconfirmed = self.unconfirmed, None
        if self.sound is not None and not self.ckpt.saving():
            self.ckpt.confirm(self.sound)
            self.sound = None

    def saved(self, step: int) -> None:
        self.unconfirmed = step

    def close(self) -> None:
        """After the last step: confirms a sound checkpoint still being written then."""
        if self.sound is not None:
            self.ckpt.confirm(self.sound)


@jax.jit
def _all_finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(tree)]))


def save(ckpt, watch, step: int, state, train_iter, source: dict) -> None:
    """Saves `state` unless a parameter is NaN or Inf (a finite step can still overflow the update) or a data file
    changed since the run read it (its steps since the last checkpoint may have read the change)."""
    watch.check(force=True)
    if not _all_finite(state["params"]):
        raise rolled_back(NonFiniteLossError, ckpt, step, f"step {step}: parameters after the update: not finite")
    ckpt.save(step, state, train_iter, source)


def rolled_back(error_class, ckpt, first_bad: int, what: str, hint: str = ""):
    """Moves checkpoints >= `first_bad` aside (the state the bad step came from, or later: unconfirmed), so that
    a rerun resumes from the last good one; returns the error saying so."""
    ckpt.wait()
    moved = [s for s in ckpt.all_steps() if s >= first_bad]
    for s in moved:
        ckpt.quarantine(s, "non-finite" if error_class is NonFiniteLossError else "diverged")
    aside = f"moved unconfirmed checkpoint(s) {', '.join(map(str, moved))} to {ckpt.workdir / 'quarantine'}; " if moved else ""
    restart = ckpt.latest_step()
    where = (
        f"checkpoint step {restart}"
        if restart is not None
        else "scratch (no good checkpoint; needs config.checkpoint.allow_fresh_start)"
    )
    return error_class(f"{what}; stopped without saving; {aside}a rerun starts from {where}" + (f" ({hint})" if hint else ""))
