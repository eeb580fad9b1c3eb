"""training/rollback.py's rules, called directly on a real (tiny) checkpoint folder: a non-finite loss or update, a
diverging loss, which checkpoint is confirmed while a loss spike runs, and what a rerun after a kill -9 during a spike
starts from and confirms. The loop's order is replayed by `_train`: each step is checked, then its checkpoint (if
any) is saved and reported to the guard.

The losses are 3.0 (threshold: max(5 x 3, 3 + 1) = 15 once divergence.WARMUP losses are seen) and spikes of 100."""

import types

import grain
import numpy as np
import pytest

from freeatten_jax.training import checkpoint, divergence, metrics, rollback

T = types.SimpleNamespace(spike_factor=5.0, spike_steps=3)  # the train config fields the guard reads
CALM, SPIKE = 3.0, 100.0


class _Watch:
    """The data-file watch: rollback.save must check it, forced, before saving."""

    def __init__(self):
        self.calls = []

    def check(self, force=False):
        self.calls.append(force)


def _checkpointer(workdir, keep=None):
    return checkpoint.Checkpointer(workdir, types.SimpleNamespace(max_to_keep=keep, async_save=False))


def _state(value=0.0):
    return {"params": {"w": np.full(2, value, np.float32)}}


def _iterator():
    return iter(grain.MapDataset.range(4).to_iter_dataset())


def _metrics(loss):
    return {"finite": bool(np.isfinite(loss)), "loss": np.float32(loss), "grad_norm": np.float32(1.0)}


def _train(guard, ckpt, losses, first=1, every=1, writer=None):
    """Steps first, first + 1, ... with these losses in the loop's order; the confirmed checkpoint after each step."""
    confirmed, watch, iterator = [], _Watch(), _iterator()
    for step, loss in enumerate(losses, first):
        guard.check(step, _metrics(loss))
        if writer is not None:
            writer.write(step, {"loss": float(loss)})
        if step % every == 0:
            rollback.save(ckpt, watch, step, _state(step), iterator, {})
            guard.saved(step)
        confirmed.append(ckpt.confirmed_step())
    return confirmed


def _quarantined(workdir):
    return sorted(p.name for p in (workdir / "quarantine").iterdir())


# --- non-finite ---------------------------------------------------------------------------------------------------


def test_a_non_finite_loss_moves_aside_the_checkpoint_it_was_computed_from_and_keeps_the_one_before(tmp_path):
    ckpt = _checkpointer(tmp_path)
    guard = rollback.Guard(T, ckpt, [], 0)
    assert _train(guard, ckpt, [CALM] * 4) == [None, 1, 2, 3]  # each step confirms the checkpoint before it
    with pytest.raises(rollback.NonFiniteLossError) as err:
        guard.check(5, _metrics(np.nan))
    assert str(err.value) == (
        f"step 5: loss nan, grad norm 1.0: not finite; stopped without saving; moved unconfirmed checkpoint(s) 4 to "
        f"{tmp_path / 'quarantine'}; a rerun starts from checkpoint step 3"
    )
    assert ckpt.all_steps() == [1, 2, 3] and _quarantined(tmp_path) == ["step_4-non-finite"]
    assert ckpt.confirmed_step() == 3


def test_a_non_finite_loss_during_a_spike_moves_aside_every_checkpoint_from_the_one_before_the_spike(tmp_path):
    """Checkpoints 2, 4, 6, 8; steps 7 and 8 spike, 9 is NaN: 6 (its next step spiked) goes too, as for a divergence."""
    ckpt = _checkpointer(tmp_path)
    guard = rollback.Guard(T, ckpt, [], 0)
    _train(guard, ckpt, [CALM] * 6 + [SPIKE] * 2, every=2)
    with pytest.raises(rollback.NonFiniteLossError, match=r"checkpoint\(s\) 6, 8 to .*; a rerun starts from checkpoint step 4$"):
        guard.check(9, _metrics(np.nan))
    assert ckpt.all_steps() == [2, 4] and ckpt.confirmed_step() == 4


def test_a_non_finite_loss_with_no_checkpoint_left_says_the_rerun_starts_from_scratch(tmp_path):
    ckpt = _checkpointer(tmp_path)
    guard = rollback.Guard(T, ckpt, [], 0)
    _train(guard, ckpt, [CALM] * 2, every=2)
    with pytest.raises(rollback.NonFiniteLossError, match=r"checkpoint\(s\) 2 to .*a rerun starts from scratch \(no good"):
        guard.check(3, _metrics(np.inf))
    assert ckpt.all_steps() == []


def test_parameters_that_are_not_finite_after_a_finite_step_are_not_saved(tmp_path):
    ckpt, watch = _checkpointer(tmp_path), _Watch()
    rollback.save(ckpt, watch, 1, _state(1.0), _iterator(), {})
    ckpt.confirm(1)
    rollback.save(ckpt, watch, 2, _state(2.0), _iterator(), {})
    with pytest.raises(rollback.NonFiniteLossError) as err:
        rollback.save(ckpt, watch, 3, {"params": {"w": np.array([1.0, np.inf], np.float32)}}, _iterator(), {})
    assert str(err.value) == (
        "step 3: parameters after the update: not finite; stopped without saving; a rerun starts from checkpoint step 2"
    )
    assert ckpt.all_steps() == [1, 2] and watch.calls == [True, True, True]  # checked, forced, before each save


# --- divergence ---------------------------------------------------------------------------------------------------


def test_a_spike_for_spike_steps_steps_moves_aside_every_checkpoint_from_the_one_before_the_spike(tmp_path):
    ckpt = _checkpointer(tmp_path)
    guard = rollback.Guard(T, ckpt, [], 0)
    assert _train(guard, ckpt, [CALM] * 6 + [SPIKE] * 2) == [None, 1, 2, 3, 4, 5, 5, 5]
    with pytest.raises(rollback.DivergenceError) as err:
        guard.check(9, _metrics(SPIKE))
    assert str(err.value) == (
        "step 9: loss 100 has been above 5 x its running median (3) for 3 steps (since step 7): diverging; stopped "
        f"without saving; moved unconfirmed checkpoint(s) 6, 7, 8 to {tmp_path / 'quarantine'}; a rerun starts from "
        "checkpoint step 5 (lower optim.lr, or set train.spike_factor=0 to stop only on NaN/Inf)"
    )
    assert ckpt.all_steps() == [1, 2, 3, 4, 5] and _quarantined(tmp_path) == [f"step_{s}-diverged" for s in (6, 7, 8)]


def test_a_spike_shorter_than_spike_steps_stops_nothing(tmp_path):
    ckpt = _checkpointer(tmp_path)
    guard = rollback.Guard(T, ckpt, [], 0)
    _train(guard, ckpt, [CALM] * 6 + [SPIKE] * 2 + [CALM] + [SPIKE] * 2 + [CALM])
    assert ckpt.all_steps() == list(range(1, 13)) and not (tmp_path / "quarantine").exists()


# --- confirmation while a spike runs -------------------------------------------------------------------------------


def test_a_checkpoint_saved_during_a_spike_is_not_confirmed_until_the_spike_ends(tmp_path):
    """Checkpoints 2, 4, 6, 8: steps 7 and 8 spike, so 6 (its next step spiked) is never confirmed, nor is 8 (saved
    during the spike) until step 9 is calm; the confirmed one stays 4 meanwhile."""
    ckpt = _checkpointer(tmp_path)
    guard = rollback.Guard(T, ckpt, [], 0)
    confirmed = _train(guard, ckpt, [CALM] * 6 + [SPIKE] * 2 + [CALM] * 2, every=2)
    assert confirmed == [None, None, 2, 2, 4, 4, 4, 4, 8, 8]


def test_a_spike_that_ends_before_the_next_checkpoint_confirms_the_one_before_it(tmp_path):
    ckpt = _checkpointer(tmp_path)
    guard = rollback.Guard(T, ckpt, [], 0)
    confirmed = _train(guard, ckpt, [CALM] * 6 + [SPIKE] * 2 + [CALM] * 4, every=6)
    assert confirmed == [None] * 8 + [6] * 4


def test_a_fresh_run_confirms_nothing_before_its_first_checkpoint_and_a_resumed_one_its_start(tmp_path):
    fresh = _checkpointer(tmp_path / "fresh")
    assert _train(rollback.Guard(T, fresh, [], 0), fresh, [CALM] * 3, every=4) == [None] * 3
    assert not (tmp_path / "fresh" / "confirmed.json").exists()
    resumed = _checkpointer(tmp_path / "resumed")
    rollback.save(resumed, _Watch(), 4, _state(), _iterator(), {})
    logged = [(s, CALM) for s in range(1, 5)]
    assert _train(rollback.Guard(T, resumed, logged, 4), resumed, [CALM] * 2, first=5, every=8) == [4, 4]


def test_a_checkpoint_is_confirmed_only_once_it_is_wholly_written_or_the_run_ends(tmp_path, monkeypatch):
    ckpt, in_flight = _checkpointer(tmp_path), [True]
    monkeypatch.setattr(ckpt, "saving", lambda: in_flight[0])
    guard = rollback.Guard(T, ckpt, [], 0)
    assert _train(guard, ckpt, [CALM] * 3, every=2) == [None] * 3  # step 3 was calm, but 2 is still being written
    in_flight[0] = False
    assert _train(guard, ckpt, [CALM], first=4, every=8) == [2]
    in_flight[0] = True
    _train(guard, ckpt, [CALM] * 3, first=5, every=6)  # 6 sound at step 7, still being written
    assert ckpt.confirmed_step() == 2
    guard.close()  # after the last step the loop waits for the save: the sound checkpoint is confirmed
    assert ckpt.confirmed_step() == 6


# --- the losses a resumed guard starts from --------------------------------------------------------------------------


def test_a_resumed_guard_starts_from_the_last_window_of_logged_losses(tmp_path):
    writer = types.SimpleNamespace(rows=[{"step": 1, "loss": 9.0}, {"step": 2, "val_loss": 2.5}, {"step": 3, "loss": 2.0}])
    assert rollback.logged_losses(writer) == [(1, 9.0), (3, 2.0)]  # rows without a loss (a validation alone) are skipped
    writer.rows = [{"step": s, "loss": float(s)} for s in range(1, divergence.WINDOW + 51)]
    assert rollback.logged_losses(writer) == [(s, float(s)) for s in range(51, divergence.WINDOW + 51)]


def test_a_resumed_guard_keeps_the_logged_spikes_out_of_the_median(tmp_path):
    """Logged 1..5 (median 3, threshold 15), a spike, then 3: as in the run that logged them, 16 is a spike after the
    resume (the spike in the median would make it 3.5, the threshold 17.5)."""
    logged = [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0), (6, SPIKE), (7, SPIKE), (8, 3.0)]
    ckpt = _checkpointer(tmp_path)
    guard = rollback.Guard(T, ckpt, logged, 8)
    with pytest.raises(rollback.DivergenceError, match=r"^step 11: loss 16 has been above 5 x its running median \(3\) "):
        _train(guard, ckpt, [16.0] * 3, first=9)


# --- kill -9 during a spike ----------------------------------------------------------------------------------------


def _killed_during_a_spike(workdir, t=T):
    """A run with checkpoints every 2 steps (2 kept, and the confirmed one) whose loss spikes at 7 and 8, killed once
    checkpoint 8 is written: nothing is closed, only the files stay."""
    ckpt, writer = _checkpointer(workdir, keep=2), metrics.MetricsWriter(workdir)
    guard = rollback.Guard(t, ckpt, [], 0)
    assert _train(guard, ckpt, [CALM] * 6 + [SPIKE] * 2, every=2, writer=writer)[-1] == 4
    writer.close()


def _rerun(workdir, t=T):
    """What a rerun builds: the checkpointer, the newest checkpoint as its start (training.resume takes the newest
    whole one), metrics.jsonl cut to it, and the guard seeded from its losses."""
    ckpt = _checkpointer(workdir, keep=2)
    start = ckpt.latest_step()
    writer = metrics.MetricsWriter(workdir, start)
    return ckpt, start, writer, rollback.Guard(t, ckpt, rollback.logged_losses(writer), start)


def test_a_kill_9_during_a_spike_leaves_the_checkpoint_before_it_confirmed_and_kept_and_the_rerun_confirms_later(tmp_path):
    """With train.spike_steps=4 the spike at 7, 8 and (after the rerun) 9 is too short to stop the run."""
    t = types.SimpleNamespace(spike_factor=5.0, spike_steps=4)
    _killed_during_a_spike(tmp_path, t)
    ckpt, start, writer, guard = _rerun(tmp_path, t)
    assert (start, ckpt.all_steps(), ckpt.confirmed_step()) == (8, [4, 6, 8], 4)  # rotation kept the confirmed 4
    confirmed = _train(guard, ckpt, [SPIKE, CALM, CALM], first=9, every=2, writer=writer)
    assert confirmed == [4, 8, 10]  # 8 (saved during the spike) only once the spike ended, at step 10
    writer.close()


def test_a_rerun_after_a_kill_9_during_a_spike_stops_where_an_uninterrupted_run_does_and_rolls_back_as_far(tmp_path):
    """The spike at 7 and 8 goes on at 9: the rerun's guard counts it from 7, as the killed run's would have, and moves
    6 (its next step spiked) and 8 aside: the rerun starts from 4, the confirmed one."""
    ckpt = _checkpointer(tmp_path / "straight", keep=2)
    with pytest.raises(rollback.DivergenceError) as straight:
        _train(rollback.Guard(T, ckpt, [], 0), ckpt, [CALM] * 6 + [SPIKE] * 3, every=2)
    _killed_during_a_spike(tmp_path / "killed")
    ckpt, start, writer, guard = _rerun(tmp_path / "killed")
    with pytest.raises(rollback.DivergenceError) as resumed:
        _train(guard, ckpt, [SPIKE], first=start + 1, every=2, writer=writer)
    writer.close()
    assert str(resumed.value) == str(straight.value).replace("straight", "killed")
    assert "(since step 7): diverging; stopped without saving; moved unconfirmed checkpoint(s) 6, 8 to " in str(resumed.value)
    assert ckpt.all_steps() == [4] and ckpt.confirmed_step() == 4
