"""training/history.py: a run folder that shows progress (metrics.jsonl's step rows, confirmed.json) but holds no
checkpoint is refused in one line naming what is missing and the option that starts over; a start from step 0 moves the
earlier run's records aside whole, never rewrites them away."""

import json
import shutil

import pytest
from helpers import read_metrics, tiny_config

from freeatten_jax.cli import train as train_cli
from freeatten_jax.training import history, loop

STEPS = {"train.checkpoint_every": 2, "optim.schedule": "constant", "train.eval_every": 100}


@pytest.fixture(scope="module")
def run6(text_glob, trained_run):
    """A run trained to step 6 (checkpoints 2, 4, 6; confirmed.json at 4)."""
    return trained_run("history-run6", tiny_config("softmax", text_glob, **STEPS))


def _config_file(tmp_path, text_glob) -> str:
    path = tmp_path / "cfg.py"
    path.write_text(
        "import sys\nsys.path.insert(0, 'tests')\nfrom helpers import tiny_config\n"
        f"def get_config():\n    return tiny_config('softmax', {text_glob!r}, **{STEPS!r})\n"
    )
    return str(path)


def _records(workdir) -> dict:
    return {name: (workdir / name).read_bytes() for name in ("metrics.jsonl", "confirmed.json")}


@pytest.mark.parametrize("gone", ["removed", "emptied"])
def test_a_run_without_its_checkpoints_is_refused_and_a_fresh_start_moves_its_history_aside(
    gone, run6, text_glob, run_cli, tmp_path
):
    """checkpoints/ removed (or emptied) after the run reached step 6: the rerun is one `error:` line naming the missing
    checkpoints, what shows the progress and the option; nothing is changed. With the option, the old records move
    to WORKDIR/previous/1/ byte for byte, and the run replays from step 0 to the same losses."""
    run = shutil.copytree(run6, tmp_path / "run")
    shutil.rmtree(run / "checkpoints")
    if gone == "emptied":
        (run / "checkpoints").mkdir()
    before = _records(run)
    code, lines = run_cli(train_cli.main, f"--config={_config_file(tmp_path, text_glob)}", f"--workdir={run}")
    assert (code, lines) == (
        1,
        [
            f"error: no checkpoint in {run / 'checkpoints'}, but {run} shows a run's progress (metrics.jsonl to step 6, "
            f"confirmed.json: step 4); not starting from scratch: restore the checkpoints, or rerun with "
            f"--config.checkpoint.allow_fresh_start=True to train from step 0 (the earlier records move to "
            f"{run / 'previous'})"
        ],
    )
    assert _records(run) == before and not (run / "previous").exists()
    loop.train_and_evaluate(tiny_config("softmax", text_glob, **STEPS, **{"checkpoint.allow_fresh_start": True}), run)
    assert _records(run / "previous" / "1") == before
    assert [(m["step"], m["loss"]) for m in read_metrics(run)] == [(m["step"], m["loss"]) for m in read_metrics(run6)]


def test_progress_is_step_rows_or_a_confirmation_and_junk_is_none(tmp_path):
    assert history.progress(tmp_path) is None
    (tmp_path / "metrics.jsonl").write_text('torn {"st\n{"other": 1}\n')
    assert history.progress(tmp_path) is None  # nothing a run's step wrote
    (tmp_path / "metrics.jsonl").write_text('{"step": 3, "loss": 2.0}\n{"step": 5, "loss": 1.9}\n{"st')
    assert history.progress(tmp_path) == "metrics.jsonl to step 5"
    (tmp_path / "confirmed.json").write_text("")  # damaged: a checkpoint was confirmed all the same
    assert history.progress(tmp_path) == "metrics.jsonl to step 5, confirmed.json"
    (tmp_path / "confirmed.json").write_text(json.dumps({"step": 4}))
    assert history.progress(tmp_path) == "metrics.jsonl to step 5, confirmed.json: step 4"


def test_each_fresh_start_moves_the_records_to_the_next_free_folder(tmp_path):
    for n in (1, 2):
        (tmp_path / "metrics.jsonl").write_text(f'{{"step": {n}}}\n')
        (tmp_path / "tensorboard").mkdir()
        (tmp_path / "tensorboard" / "events").write_text(str(n))
        assert history.move_aside(tmp_path) == tmp_path / "previous" / str(n)
        assert (tmp_path / "previous" / str(n) / "metrics.jsonl").read_text() == f'{{"step": {n}}}\n'
        assert (tmp_path / "previous" / str(n) / "tensorboard" / "events").read_text() == str(n)
        assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "tensorboard").exists()
    assert history.move_aside(tmp_path) is None  # nothing left to move
