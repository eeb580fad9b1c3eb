"""freeatten-eval resumes: each finished cell is saved in OUT/cells as it is done; SIGTERM stops it after the cell
(exit 75), kill -9 loses at most the cell in progress, and the rerun's results equal an uninterrupted run's, byte for
byte. A rerun under other settings is refused, and one process at a time owns an output folder."""

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from helpers import tiny_config

from freeatten_jax.cli import evaluate as eval_cli
from freeatten_jax.errors import EXIT_PREEMPTED, UserError
from freeatten_jax.evaluation import results, suite
from freeatten_jax.training import lock

# 3 lengths (16, 32, 64), the analysis and 2 x 3 retrieval cells: 10 cells per run, 20 with the p=15 switch
SETTINGS = suite.Settings(multipliers=(1, 2, 4), eval_tokens=2 * 65, passkey_depths=(0.5,), passkey_keys=1, passkey_candidates=3)
FLAGS = ["--multipliers=1,2,4", "--eval_tokens=130", "--passkey_depths=0.5", "--passkey_keys=1", "--passkey_candidates=3"]
CELLS = 20


@pytest.fixture(scope="module")
def run(text_glob, trained_run):
    """A tiny lssa run's workdir (the p=15 switch applies to it)."""
    return str(trained_run("eval-resume-lssa", tiny_config("lssa", text_glob)))


@pytest.fixture(scope="module")
def straight_out(run, tmp_path_factory):
    """The output folder of the evaluation never interrupted."""
    out = tmp_path_factory.mktemp("straight")
    suite.run_suite([run], ["p=15"], SETTINGS, str(out))
    return out


@pytest.fixture
def straight(straight_out):
    """results.json of the evaluation never interrupted."""
    return (straight_out / "results.json").read_bytes()


def _cells(out) -> list:
    """The cells saved in `out` (each run's whole result and the settings not counted), every one whole JSON."""
    saved = [p for p in (out / "cells").glob("*/*.json") if p.stem != "run"]
    return [json.loads(p.read_text()) for p in saved]


def _interrupt(run, out, sig, after: int) -> subprocess.CompletedProcess:
    """freeatten-eval in a child process, sent `sig` once `after` cells are saved."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}  # with the session's compilation cache (conftest)
    args = [sys.executable, "eval.py", f"--workdir={run}", "--switch=p=15", f"--out={out}", *FLAGS]
    child = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while (not (out / "cells").exists() or len(list((out / "cells").glob("*/*.json"))) < after) and child.poll() is None:
        assert time.monotonic() < deadline, "the evaluation saved no cells"
        time.sleep(0.05)
    child.send_signal(sig)
    _, stderr = child.communicate(timeout=120)
    return subprocess.CompletedProcess(args, child.returncode, "", stderr)


def _resume(run, out, run_cli) -> list[str]:
    code, lines = run_cli(eval_cli.main, f"--workdir={run}", "--switch=p=15", f"--out={out}", *FLAGS)
    assert code == 0, lines[-5:]
    return lines


@pytest.mark.slow
def test_sigterm_stops_after_the_cell_and_the_rerun_equals_an_uninterrupted_run(run, straight, tmp_path, run_cli):
    stopped = _interrupt(run, tmp_path, signal.SIGTERM, after=2)
    done = len(_cells(tmp_path))
    assert stopped.returncode == EXIT_PREEMPTED, stopped.stderr[-2000:]
    last = stopped.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"SIGTERM: stopped with {done} of {CELLS} cells done, each saved in .*; rerun the same command to resume", last
    )
    assert 2 <= done < CELLS and not (tmp_path / "results.json").exists()
    lines = _resume(run, tmp_path, run_cli)
    assert any(f"resuming: {done} of {CELLS} cells done already" in line for line in lines)
    assert (tmp_path / "results.json").read_bytes() == straight


@pytest.mark.slow
def test_kill_9_loses_at_most_the_cell_in_progress_and_the_rerun_equals_an_uninterrupted_run(run, straight, tmp_path, run_cli):
    killed = _interrupt(run, tmp_path, signal.SIGKILL, after=3)
    assert killed.returncode == -signal.SIGKILL
    done = len(_cells(tmp_path))  # every saved cell whole (json.loads would fail on a torn one)
    assert 3 <= done < CELLS
    lines = _resume(run, tmp_path, run_cli)  # the lock the killed process held went with it
    assert any(f"resuming: {done} of {CELLS} cells done already" in line for line in lines)
    assert (tmp_path / "results.json").read_bytes() == straight
    assert not list(tmp_path.glob("cells/**/.*.tmp-*"))  # a write the kill interrupted is cleared


@pytest.mark.slow
def test_a_rerun_skips_the_cells_done_and_measures_the_others(run, tmp_path, capsys):
    settings = dataclasses.replace(SETTINGS, passkey_depths=())  # 3 cells: loss at 16 and 32, the analysis
    settings = dataclasses.replace(settings, multipliers=(1, 2))
    (first,) = suite.run_suite([run], [], settings, str(tmp_path))
    (job,) = (tmp_path / "cells").glob("*/")
    saved = json.loads((job / "loss-16.json").read_text())
    saved["loss"]["loss"] = 123.0  # a value no measurement gives: read back, so the cell was skipped
    (job / "loss-16.json").write_text(json.dumps(saved))
    (job / "attention.json").unlink()
    (job / "run.json").unlink()
    capsys.readouterr()
    (again,) = suite.run_suite([run], [], settings, str(tmp_path))
    assert "resuming: 2 of 3 cells done already" in capsys.readouterr().err
    assert again.lengths[0].loss == 123.0 and again.lengths[1] == first.lengths[1]
    assert again.attention == first.attention  # measured again, alike
    assert results.read(tmp_path / "results.json")[0] == [again]
    (untouched,) = suite.run_suite([run], [], settings, str(tmp_path))  # every cell done: nothing measured
    assert untouched == again


@pytest.mark.slow
def test_a_rerun_in_the_middle_of_the_retrieval_grid_draws_the_keys_of_an_uninterrupted_run(run, straight_out, tmp_path):
    shutil.copytree(straight_out, tmp_path / "out")
    (job,) = (tmp_path / "out" / "cells").glob("*[[]none[]]*/")
    last = job / "retrieval-64-0.5.json"  # scored (the cells before it are too short for the prompt, but draw keys)
    assert json.loads(last.read_text())["cell"]["keys"] == 1
    for done in (last, job / "run.json", tmp_path / "out" / "results.json"):
        done.unlink()
    suite.run_suite([run], ["p=15"], SETTINGS, str(tmp_path / "out"))
    assert (tmp_path / "out" / "results.json").read_bytes() == (straight_out / "results.json").read_bytes()


@pytest.mark.slow
def test_a_rerun_under_other_settings_is_refused_naming_the_setting(run, tmp_path):
    settings = dataclasses.replace(SETTINGS, multipliers=(1,), passkey_depths=())
    suite.run_suite([run], [], settings, str(tmp_path))
    changes = {"multipliers": (1, 2), "eval_tokens": 99, "seed": 1}
    for name, value in changes.items():
        theirs, ours = json.dumps(getattr(settings, name)), json.dumps(value)
        message = f"--out={tmp_path}: measured with {name}={theirs}, this evaluation with {ours}; rerun with those settings"
        with pytest.raises(UserError, match=re.escape(message)):
            suite.run_suite([run], [], dataclasses.replace(settings, **{name: value}), str(tmp_path))
    suite.run_suite([run], [], dataclasses.replace(settings, implementation="reference"), str(tmp_path))  # not compared


def test_one_evaluation_at_a_time_owns_the_output_folder(run, tmp_path):
    with lock.hold(tmp_path, flag="--out"):
        with pytest.raises(
            lock.WorkdirBusyError, match=f"in use by pid {os.getpid()} .*; wait for it, stop it, or use another --out"
        ):
            suite.run_suite([run], [], SETTINGS, str(tmp_path))
