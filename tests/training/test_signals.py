"""training/signals.py: the first SIGINT or SIGTERM asks for a stop and says so in one line; a second SIGINT interrupts at
once; the command line turns that into one line and exit 130; the train command, signalled at any moment of its
start-up, exits 75 with nothing half-written."""

import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from helpers import read_metrics

from freeatten_jax.cli import shared
from freeatten_jax.errors import EXIT_INTERRUPTED, EXIT_PREEMPTED
from freeatten_jax.training import signals


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_first_signal_asks_for_a_stop_and_says_so_and_a_second_ctrl_c_interrupts(signum, capfd):
    stop = signals.StopSignal()
    try:
        os.kill(os.getpid(), signum)
        assert stop.requested and stop.name == signum.name and stop.any_process()
        assert capfd.readouterr().err == f"\n{signum.name}: stopping after this step (Ctrl-C again: at once, unsaved)\n"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        assert capfd.readouterr().err == ""  # the interruption is the command line's to report
    finally:
        stop.restore()


def test_an_interrupted_command_is_one_line_and_exit_130(capsys):
    def main(argv):
        raise KeyboardInterrupt

    try:
        shared.run(main, ["prog"])
    except KeyboardInterrupt:
        pytest.fail("the KeyboardInterrupt (and its traceback) reached the user")
    except SystemExit as stopped:
        assert stopped.code == EXIT_INTERRUPTED == 130
    else:
        pytest.fail("no exit")
    assert capsys.readouterr().err.strip().splitlines() == [
        "interrupted: the step in progress was not saved (rerun the same command to resume)"
    ]


# --- a signal at any moment of start-up, to the train command as a scheduler runs it --------------------------------

STEPS = {"train.checkpoint_every": 2, "optim.schedule": "constant", "train.eval_every": 100}
_STOPPED_STARTING = "SIGTERM during start-up: stopped before training, nothing to save; rerun the same command to resume"


@pytest.fixture(scope="module")
def run6(text_glob, trained_run):
    """A run trained to step 6 (checkpoints 2, 4, 6): the child resumes a copy of it, so its start-up restores."""
    from helpers import tiny_config

    return trained_run("signals-run6", tiny_config("softmax", text_glob, **STEPS))


def _handlers_installed(pid: int) -> bool:
    """Whether process `pid` catches SIGTERM (its SigCgt mask: Python catches SIGINT from the start, SIGTERM only when
    told)."""
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, delay",
    [(signal.SIGTERM, d) for d in (0.0, 0.5, 1.0, 1.5, 1.8, 2.1, 2.5, 4.0)] + [(signal.SIGINT, d) for d in (0.0, 2.0)],
)
def test_a_signal_at_any_moment_of_start_up_exits_75_with_nothing_half_written(signum, delay, run6, text_glob, tmp_path):
    """`python train.py` (freeatten-train's entry) resuming a run of 6 steps for many more has its handlers up before
    it imports jax (~0.03 s after it starts; the imports take ~1.5 s, then come the config, the data, the lock, the
    restore, the compile and the first batch) and gets the signal `delay` s later: it exits 75 every time, saying where
    it stopped. Before the first step nothing changes; at a step, that step's checkpoint is whole; no temporary or lock
    file is left, and the rows of steps 1..6 keep their values."""
    run = shutil.copytree(run6, tmp_path / "run")
    before = {name: (run / name).read_bytes() for name in ("metrics.jsonl", "confirmed.json")}
    config = tmp_path / "cfg.py"
    overrides = {**STEPS, "train.steps": 100_000, "train.checkpoint_every": 1000}
    config.write_text(
        "import sys\nsys.path.insert(0, 'tests')\nfrom helpers import tiny_config\n"
        f"def get_config():\n    return tiny_config('softmax', {text_glob!r}, **{overrides!r})\n"
    )
    child = subprocess.Popen(
        [sys.executable, "train.py", f"--config={config}", f"--workdir={run}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 30
    while not _handlers_installed(child.pid) and time.monotonic() < deadline:
        time.sleep(0.002)
    assert "jaxlib" not in pathlib.Path(f"/proc/{child.pid}/maps").read_text()  # up before the imports that take seconds
    time.sleep(delay)
    child.send_signal(signum)
    out, err = (stream.decode().splitlines() for stream in child.communicate(timeout=300))
    assert child.returncode == EXIT_PREEMPTED == 75, (out[-3:], err[-5:])
    assert f"{signum.name}: stopping " in "\n".join(err) and not [line for line in err if "Traceback" in line], err
    steps = sorted(int(p.name) for p in (run / "checkpoints").iterdir())  # int() fails on a temporary folder
    assert not (run / "lock").exists()
    rows = read_metrics(run)
    if out[-1] == _STOPPED_STARTING.replace("SIGTERM", signum.name):
        assert steps == [2, 4, 6] and {name: (run / name).read_bytes() for name in before} == before
        return
    stopped = int(
        re.fullmatch(r"stopped at step (\d+) by a signal, checkpoint saved; rerun the same command to resume", out[-1])[1]
    )
    assert steps[-1] == stopped > 6 and [m["step"] for m in rows] == list(range(1, stopped + 1))
    assert rows[:6] == read_metrics(run6)
