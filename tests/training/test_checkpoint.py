"""training/checkpoint.py with slowed storage: a save that is due while the one before is still being written waits for
it and says so once, so the newest whole checkpoint is never more than one interval behind the last one due."""

import re

import orbax.checkpoint as ocp
from helpers import read_metrics, tiny_config

from freeatten_jax.training import distributed, loop

EVERY = 2


def test_a_save_due_while_the_one_before_is_written_waits_for_it_says_so_once_and_never_falls_behind(
    text_glob, tmp_path, monkeypatch, capsys
):
    """Each checkpoint takes 0.6 s to finish (its finalisation in orbax's background thread, slowed: slow storage), a
    step a few milliseconds: every save from the second on is due while the one before is still being written. Before
    each step the newest whole checkpoint (a numbered folder, not a temporary one) is at most `checkpoint_every` steps
    older than the last one due, and at most one is in flight; the first wait is said once, with how long it took."""
    finalize, fetch, seen = ocp.CheckpointManager._finalize, distributed.host_local_batch_to_global, []

    def slow_finalize(self, *args):
        import time

        time.sleep(0.6)
        return finalize(self, *args)

    def fetch_and_look(*args):
        names = [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()]
        seen.append(([int(n) for n in names if n.isdigit()], [n for n in names if not n.isdigit()]))
        return fetch(*args)

    monkeypatch.setattr(ocp.CheckpointManager, "_finalize", slow_finalize)
    monkeypatch.setattr(distributed, "host_local_batch_to_global", fetch_and_look)
    cfg = tiny_config("softmax", text_glob, **{"train.steps": 12, "train.checkpoint_every": EVERY, "train.eval_every": 0})
    loop.train_and_evaluate(cfg, tmp_path / "run")
    said = [line for line in capsys.readouterr().out.splitlines() if "still being written" in line]
    assert len(said) == 1 and re.fullmatch(
        r"checkpoint 4 is due while checkpoint 2 is still being written: waited (\d+\.\d) s for it \(the saves take "
        r"longer than train\.checkpoint_every steps; at most one is written at a time; later waits are not said\)",
        said[0],
    ), said
    assert float(re.search(r"waited (\d+\.\d) s", said[0])[1]) >= 0.3
    for step, (whole, writing) in enumerate(seen, 1):  # before step `step`: steps 1 .. step - 1 done
        due = (step - 1) // EVERY * EVERY
        assert due - max(whole, default=0) <= EVERY and len(writing) <= 1, (step, whole, writing)
    assert [m["step"] for m in read_metrics(tmp_path / "run")] == list(range(1, 13))
