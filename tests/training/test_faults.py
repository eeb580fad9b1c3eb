"""Faults a real run meets, each needing the training loop: kill -9 (also during an async save), a checkpoint not what
was saved, a blow-up, two trainers on one workdir, data changing under the run, saves failing, an unwritable checkpoint
folder; and bad inputs to every entry point, each one line. The rooms' own rules are tested directly in tests/training/.

Every test copies one trained run folder (steps 1..6, checkpoints 2, 4, 6) and compares what it resumes to with one
uninterrupted run of 8 steps (constant learning rate: the number of steps does not change the schedule).
"""

import errno
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from helpers import SigtermAtBatch, read_metrics, tiny_config, write_corpus

from freeatten_jax import data
from freeatten_jax.cli import evaluate as eval_cli
from freeatten_jax.cli import generate as generate_cli
from freeatten_jax.cli import train as train_cli
from freeatten_jax.data import shards
from freeatten_jax.errors import EXIT_PREEMPTED
from freeatten_jax.training import checkpoint, distributed, lock, loop, rollback, run_dir, storage

STEPS = {"train.checkpoint_every": 2, "optim.schedule": "constant", "train.eval_every": 100}


def _cfg(text_glob, steps, **overrides):
    return tiny_config("softmax", text_glob, **{**STEPS, "train.steps": steps, **overrides})


@pytest.fixture(scope="module")
def runs(text_glob, trained_run):
    """(a run folder trained to step 6, the losses of an uninterrupted run of 8 steps by step)."""
    straight = read_metrics(trained_run("faults-straight8", _cfg(text_glob, 8)))
    return trained_run("faults-run6", _cfg(text_glob, 6)), {m["step"]: m["loss"] for m in straight}


@pytest.fixture
def run6(runs, tmp_path):
    shutil.copytree(runs[0], tmp_path / "run")
    return tmp_path / "run"


def _assert_replays_exactly(workdir, straight):
    """metrics.jsonl holds steps 1..8 once each, with the uninterrupted run's losses."""
    rows = read_metrics(workdir)
    assert [m["step"] for m in rows] == list(range(1, 9))
    assert {m["step"]: m["loss"] for m in rows} == straight


def test_a_blow_up_stops_in_one_line_quarantines_unconfirmed_checkpoints_and_a_sane_rerun_proceeds(run6, text_glob, capsys):
    wild = {"optim.lr": 1e9, "optim.warmup_steps": 0, "train.checkpoint_every": 1}  # step 7 explodes the weights; 8 is NaN
    with pytest.raises(rollback.NonFiniteLossError) as err:
        loop.train_and_evaluate(_cfg(text_glob, 12, **wild), run6)
    message = str(err.value)
    assert "\n" not in message and message.startswith("step ") and "not finite" in message
    assert message.startswith("step 8: loss ") and message.endswith(
        f"moved unconfirmed checkpoint(s) 7 to {run6 / 'quarantine'}; a rerun starts from checkpoint step 6"
    ), message
    restart = 6
    assert checkpoint.Checkpointer(run6, read_only=True).all_steps() == [4, 6]  # saving 7 dropped 2 (max_to_keep 3)
    assert [p.name for p in (run6 / "quarantine").iterdir()] == ["step_7-non-finite"]
    model, _, _ = run_dir.load_params(run6)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    sane = loop.train_and_evaluate(_cfg(text_glob, restart + 4), run6)
    assert f"resumed from step 6 (checkpoint in {run6}; confirmed good)" in capsys.readouterr().out
    assert [m["step"] for m in sane] == list(range(restart + 1, restart + 5)) and all(np.isfinite(m["loss"]) for m in sane)
    assert json.loads((run6 / "confirmed.json").read_text())["step"] == restart + 2  # step restart + 3 confirmed it


def test_a_second_trainer_on_the_workdir_is_refused_naming_the_holder(run6, text_glob):
    with lock.hold(run6):
        with pytest.raises(lock.WorkdirBusyError, match=f"is in use by pid {os.getpid()} on host {socket.gethostname()};"):
            loop.train_and_evaluate(_cfg(text_glob, 8), run6)
    assert checkpoint.Checkpointer(run6, read_only=True).all_steps() == [2, 4, 6]


def test_the_lock_file_goes_with_its_holder_and_a_removed_one_is_not_taken(tmp_path, monkeypatch):
    """A clean exit removes WORKDIR/lock; a trainer that opened the file just before its holder removed it locks the
    next file, not the removed one (two trainers would each hold a lock)."""
    with lock.hold(tmp_path):
        assert (tmp_path / "lock").read_text() == f"pid {os.getpid()} on host {socket.gethostname()}\n"
    assert not (tmp_path / "lock").exists()
    opened, calls = os.open, []

    def open_then_removed(path, *args):
        fd = opened(path, *args)
        if not calls:
            os.unlink(path)  # its holder exits in between
        calls.append(path)
        return fd

    monkeypatch.setattr(os, "open", open_then_removed)
    with lock.hold(tmp_path):
        assert len(calls) == 2 and (tmp_path / "lock").read_text().startswith(f"pid {os.getpid()} ")


def test_an_unwritable_checkpoint_folder_fails_at_start_up_and_keeps_every_checkpoint(run6, text_glob, monkeypatch):
    folder = run6 / "checkpoints"
    folder.chmod(0o555)
    if os.geteuid() == 0:  # root ignores permission bits: fail the write the way the kernel does for anyone else
        path_class = type(storage.path(folder))
        real = path_class.write_text

        def deny(self, *args, **kwargs):
            if os.fspath(self.parent) == os.fspath(folder):
                raise PermissionError(13, "Permission denied")
            return real(self, *args, **kwargs)

        monkeypatch.setattr(path_class, "write_text", deny)
    try:
        with pytest.raises(checkpoint.CheckpointWriteError, match=f"cannot write checkpoints to {folder}: Permission denied;"):
            loop.train_and_evaluate(_cfg(text_glob, 8), run6)
    finally:
        folder.chmod(0o755)
    assert [m["step"] for m in read_metrics(run6)] == list(range(1, 7))
    monkeypatch.undo()
    assert checkpoint.Checkpointer(run6, read_only=True).all_steps() == [2, 4, 6]
    assert run_dir.load_params(run6)[2] == 6


def _files(folder: pathlib.Path) -> dict:
    """{relative path: bytes} of every file under `folder` (links as their targets' names): what a run wrote. The lock
    is left out: it names the process that holds it, which takes it before it reads anything."""
    return {
        str(p.relative_to(folder)): (os.readlink(p) if p.is_symlink() else p.read_bytes())
        for p in sorted(folder.rglob("*"))
        if (p.is_file() or p.is_symlink()) and p.name != "lock"
    }


def _config_file(tmp_path, text_glob, steps, **overrides) -> str:
    """A config file giving `_cfg(text_glob, steps, **overrides)`, for running the train command line in-process."""
    path = tmp_path / "cfg.py"
    path.write_text(
        f"import sys\nsys.path[:0] = {[str(pathlib.Path(__file__).parent), str(pathlib.Path(__file__).parents[1])]!r}\n"
        "from test_faults import _cfg\n"
        f"def get_config():\n    return _cfg({text_glob!r}, {steps}, **{overrides!r})\n"
    )
    return str(path)


def _another_steps_state(step: pathlib.Path) -> None:
    shutil.rmtree(step / "state")
    shutil.copytree(step.parent / "4" / "state", step / "state")  # a whole, readable state: of step 4, not 6


def test_a_latest_checkpoint_not_what_was_saved_is_moved_aside_and_the_run_replays_exactly(runs, run6, text_glob, capsys):
    """The resume policy's cases are training/test_resume.py's; here the loop goes on from the checkpoint before."""
    _another_steps_state(run6 / "checkpoints" / "6")
    capsys.readouterr()
    loop.train_and_evaluate(_cfg(text_glob, 8), run6)
    out = capsys.readouterr().out
    assert f"resumed from step 4 (checkpoint in {run6}; confirmed good)" in out
    assert [p.name for p in (run6 / "quarantine").iterdir()] == ["step_6-fingerprint-mismatch"]
    _assert_replays_exactly(run6, runs[1])


def test_data_that_changes_while_training_stops_the_run_in_one_line_and_the_rerun_on_restored_data_replays(
    runs, tmp_path, monkeypatch
):
    """A preprocessing job rewrites a training file at its size while step 5 reads its batch: the run stops before its
    next checkpoint (6) in one line naming the file, keeping the checkpoints; with the file restored, a rerun resumes
    from checkpoint 4 and replays exactly (the watch's other findings: test_integrity.py)."""
    pattern, what = write_corpus(tmp_path / "data"), r"rewritten: same size, \d+ bytes, another modification time"
    path = sorted(pathlib.Path(pattern).parent.glob(pathlib.Path(pattern).name))[0]
    original, fetched, fetch = path.read_bytes(), [], distributed.host_local_batch_to_global

    def fetch_and_change(*args):
        fetched.append(1)
        if len(fetched) == 5:
            path.write_bytes(path.read_bytes()[::-1])
        return fetch(*args)

    monkeypatch.setattr(distributed, "host_local_batch_to_global", fetch_and_change)
    with pytest.raises(data.DataChangedError) as err:
        loop.train_and_evaluate(_cfg(pattern, 8), tmp_path / "run")
    assert re.fullmatch(
        rf"{re.escape(str(path))} changed while training \({what}\); stopped without saving, every checkpoint is kept: "
        r"restore the file and rerun to resume from the last checkpoint, or rerun with "
        r"--config.data.allow_changed=True to go on with the data as it is now",
        str(err.value),
    ), str(err.value)
    assert checkpoint.Checkpointer(tmp_path / "run", read_only=True).all_steps() == [2, 4]
    monkeypatch.undo()
    path.write_bytes(original)
    loop.train_and_evaluate(_cfg(pattern, 8), tmp_path / "run")
    _assert_replays_exactly(tmp_path / "run", runs[1])


@pytest.fixture
def tmpfs(tmp_path):
    """Mounts a small tmpfs (root only: mounting needs it); yields a function mount(size, options) -> its path."""
    mounted = []

    def mount(size: str, options: str = "") -> pathlib.Path:
        point = tmp_path / f"fs{len(mounted)}"
        point.mkdir()
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}{options}", "tmpfs", str(point)], capture_output=True)
        if result.returncode:
            pytest.skip(f"mounting a tmpfs needs root: {result.stderr.decode().strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "--lazy", str(point)], check=True)


def test_a_failure_that_the_next_save_re_raises_is_one_line_naming_the_os_error(tmp_path, monkeypatch):
    """Orbax's save re-raises an earlier background save's failure (any type, tensorstore's wording of the OS error):
    the save call turns it into the one CheckpointWriteError line, with the OS error spelt out."""
    ckpt = checkpoint.Checkpointer(tmp_path)

    def reraise(*args, **kwargs):
        raise ValueError("Error writing local file: os_error_code='28' [source locations='tensorstore/...']\nmore lines")

    monkeypatch.setattr(ckpt.manager, "save", reraise)
    monkeypatch.setattr(checkpoint.integrity, "iterator", lambda iterator: {})
    with pytest.raises(checkpoint.CheckpointWriteError) as err:
        ckpt.save(1, {"w": np.zeros(2, np.float32)}, None, {})
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"saving a checkpoint to {tmp_path / 'checkpoints'} failed (")
    assert f"({os.strerror(errno.ENOSPC)}: ValueError: Error writing local file" in message, message


def test_a_save_failing_in_the_background_stops_the_run_before_its_next_step(run6, text_glob, monkeypatch):
    """Orbax reports a failure of its save thread (as a full disk or a lost bucket gives) only when asked: the loop
    asks before every step, so the run stops at once, not at the next checkpoint (12) or at the end (16)."""
    started, fetched = [], []
    save, fetch = ocp.CheckpointManager.save, distributed.host_local_batch_to_global

    def failed_in_the_background(self):
        if started:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(
        ocp.CheckpointManager, "save", lambda self, step, *a, **k: started.append(step) or save(self, step, *a, **k)
    )
    monkeypatch.setattr(ocp.CheckpointManager, "check_for_errors", failed_in_the_background)
    monkeypatch.setattr(distributed, "host_local_batch_to_global", lambda *args: fetched.append(1) or fetch(*args))
    with pytest.raises(
        checkpoint.CheckpointWriteError, match=r"^saving a checkpoint to .* failed \(OSError: \[Errno 28\] No space"
    ):
        loop.train_and_evaluate(_cfg(text_glob, 16, **{"train.log_every": 100, "train.checkpoint_every": 4}), run6)
    assert started == [8] and len(fetched) == 2  # steps 7 and 8: the failure is known before step 9 starts


_SAVE_FAILS = """
import sys, time
import orbax.checkpoint as ocp
from freeatten_jax.cli import train as cli
from freeatten_jax.training import distributed
filler = sys.argv[1]  # a file that fills the disk as the checkpoint starts saving ('' for none)
save, fetch, fetched = ocp.CheckpointManager.save, distributed.host_local_batch_to_global, []
def save_and_wait(self, step, *args, **kwargs):  # returns once the save has ended, as a step longer than the save would
    if filler:
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(bytes(4096))
            except OSError:
                pass
    started = save(self, step, *args, **kwargs)
    while self.is_saving_in_progress():
        time.sleep(0.05)
    return started
def announced(*args):
    fetched.append(1)
    print(f"batch {len(fetched)}", flush=True)
    return fetch(*args)
ocp.CheckpointManager.save, distributed.host_local_batch_to_global = save_and_wait, announced
sys.argv = ["train.py", *sys.argv[2:]]
cli.main()
"""
_PROGRESS = r"\| loss \d+\.\d{4} \| lr 1\.00e-02 \| elapsed 0m\d\ds( \| .* tok/s .*)?"
SAVE_FAULTS = {"ulimit -f": "File too large", "full disk": "No space left on device"}


@pytest.mark.slow
@pytest.mark.parametrize("fault", SAVE_FAULTS)
def test_a_failed_save_stops_the_run_before_its_next_step_in_one_line_and_a_rerun_replays(
    fault, runs, run6, text_glob, tmpfs, tmp_path
):
    """The checkpoint of step 8 fails in the background: its array files exceed a file size limit of 59 KiB
    (`ulimit -f`), or the disk fills up as it starts. The save ends before step 9 would start (as
    behind a step longer than the save): no step starts after it, stdout is the progress to step 8, stderr the error
    line alone (no thread's traceback: tensorstore's callbacks into the closed loop included), the checkpoints before
    keep, and a rerun once the storage is fixed replays exactly."""
    workdir, filler, limit = run6, "", "unlimited"
    if fault == "full disk":
        workdir = tmpfs("8m") / "run"
        shutil.copytree(run6, workdir)
        filler = workdir.parent / "filler"
    else:
        limit = "59"  # KiB
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "JAX_ENABLE_COMPILATION_CACHE": "false"}  # no cache entry to cut off
    config = _config_file(tmp_path, text_glob, 12, **{"train.checkpoint_every": 4})
    result = subprocess.run(
        ["bash", "-c", f'ulimit -f {limit} && exec "$@"', "bash", sys.executable, "-c", _SAVE_FAILS, str(filler)]
        + [f"--config={config}", f"--workdir={workdir}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    expected = [
        re.escape(f"resumed from step 6 (checkpoint in {workdir}; not yet confirmed: its next step has not run)"),
        re.escape("training softmax for steps 7..12: 1 devices, mesh {'data': 1, 'fsdp': 1, 'tensor': 1, 'context': 1}, ")
        + r"batch 8 x 16 tokens",
        r"MFU not reported: .*",
        "batch 1",
        r"step 7/12 \| loss \d+\.\d{4} \| first step in \d+\.\d s \(compilation included\)",
        "batch 2",
        "step 7/12 " + _PROGRESS,  # a step's bookkeeping waits for the next step to be under way
        "step 8/12 " + _PROGRESS,
    ]
    lines = result.stdout.splitlines()
    assert len(lines) == len(expected), lines
    assert [line for e, line in zip(expected, lines) if not re.fullmatch(e, line)] == [], lines
    errors = result.stderr.splitlines()
    assert result.returncode == 1 and len(errors) == 1, result.stderr[-3000:]
    assert re.fullmatch(
        rf"error: saving a checkpoint to {re.escape(str(workdir / 'checkpoints'))} failed \(.*{SAVE_FAULTS[fault]}.*\); "
        r"stopped; the earlier checkpoints are kept: free space or fix the storage, then rerun",
        errors[0],
    ), errors
    assert checkpoint.Checkpointer(workdir, read_only=True).all_steps() == [2, 4, 6]
    if filler:
        filler.unlink()
    loop.train_and_evaluate(_cfg(text_glob, 8), workdir)
    _assert_replays_exactly(workdir, runs[1])


def test_the_error_line_stays_last_and_whole_when_threads_report_errors_around_it():
    """Threads reporting errors as a failed save shuts down (tensorstore's callbacks into a closed event loop, whenever
    the machine is slow) neither follow the `error:` line nor split it: a report half written when the error comes
    ends first, and a thread's output after the error goes nowhere."""
    code = """
import os, sys, threading, time
from freeatten_jax.cli import shared as cli
from freeatten_jax.errors import UserError

half_written = threading.Event()

class Closed(RuntimeError):
    def __str__(self):  # the report has written its last line up to "Closed: "
        half_written.set()
        time.sleep(0.5)
        return "Event loop is closed"

class Callback:
    def __del__(self):  # an exception Python can only report: sys.unraisablehook
        raise Closed()

def late():
    time.sleep(1)
    os.write(2, b"Traceback (most recent call last): a thread's late output\\n")

def main(argv):
    threading.Thread(target=Callback).start()
    threading.Thread(target=late).start()
    half_written.wait()
    raise UserError("the save failed")

cli.run(main, sys.argv)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = result.stderr.splitlines()
    assert result.returncode == 1 and lines[-1] == "error: the save failed" and "Closed: Event loop is closed" in lines, lines


def test_callbacks_into_the_closed_loop_of_a_failed_save_are_not_reported():
    """As a save fails, orbax closes its event loop while tensorstore's writes are in flight: each then calls back into
    the closed loop, and Python reports the RuntimeError as unraisable (a traceback, on machines where the writes are
    slow enough). The error line says what failed: those reports are dropped, and only those."""
    code = """
import asyncio, sys, threading
from freeatten_jax.cli import shared as cli
from freeatten_jax.errors import UserError

loop = asyncio.new_event_loop()
loop.close()

class Write:
    def __del__(self):  # a callback no caller can catch, into the closed loop
        loop.call_soon_threadsafe(print)

class Other:
    def __del__(self):
        raise RuntimeError("another thread's error")

def main(argv):
    for callback in (Write, Write, Other):
        thread = threading.Thread(target=callback)
        thread.start()
        thread.join()
    raise UserError("the save failed")

cli.run(main, sys.argv)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = result.stderr.splitlines()
    assert result.returncode == 1 and lines[-1] == "error: the save failed", lines
    assert "RuntimeError: another thread's error" in lines and not any("Event loop is closed" in line for line in lines)


def test_too_little_free_space_or_a_read_only_workdir_is_refused_before_anything_is_written(text_glob, tmpfs, run_cli, tmp_path):
    small, read_only = tmpfs("64k"), tmpfs("1m", ",ro")
    config = _config_file(tmp_path, text_glob, 8)
    code, lines = run_cli(train_cli.main, f"--config={config}", f"--workdir={small / 'run'}")
    assert (
        code == 1
        and len(lines) == 1
        and re.match(
            rf"error: {small / 'run'} has 0\.\d MiB free but a checkpoint of this run "
            r"takes about 0\.\d MiB; free space",
            lines[0],
        )
    ), lines
    code, lines = run_cli(train_cli.main, f"--config={config}", f"--workdir={read_only / 'run'}")
    assert code == 1 and lines == [f"error: --workdir={read_only / 'run'}: {read_only} is not writable; use another --workdir"]
    assert not list(small.iterdir()) and not list(read_only.iterdir())


def test_sigterm_saves_and_exits_75(run6, text_glob, run_cli, tmp_path, monkeypatch, caplog):
    """A scheduler must not take a preempted run for a finished one (the resume is exact: test_train's preemption test).
    The run says why it stops in progress lines like the others, not in a log record."""
    monkeypatch.setattr(distributed, "host_local_batch_to_global", SigtermAtBatch(1))
    code, lines = run_cli(train_cli.main, f"--config={_config_file(tmp_path, text_glob, 8)}", f"--workdir={run6}")
    assert code == EXIT_PREEMPTED == 75 and lines[-2:] == [
        "SIGTERM at step 7: saving a checkpoint, then stopping",
        "stopped at step 7 by a signal, checkpoint saved; rerun the same command to resume",
    ]
    assert not [r for r in caplog.records if "signal" in r.getMessage()]
    assert checkpoint.Checkpointer(run6, read_only=True).latest_step() == 7


# --- kill -9 ------------------------------------------------------------------------------------------------------

_CHILD = """
import os, signal, sys, time
sys.path.insert(0, "tests")
from helpers import tiny_config
from freeatten_jax.training import checkpoint, distributed, loop
point = sys.argv[3]
if point == "async save":  # SIGKILL while the step-4 checkpoint is written in the background
    save = checkpoint.Checkpointer.save
    def save_then_die(self, step, *args):
        save(self, step, *args)
        if step == 4:
            os.kill(os.getpid(), signal.SIGKILL)
    checkpoint.Checkpointer.save = save_then_die
else:  # waits while fetching batch 5 (after checkpoint 4), holding the lock, for the parent's SIGKILL
    fetch, calls = distributed.host_local_batch_to_global, []
    def fetch_and_wait(*args):
        calls.append(1)
        if len(calls) == 5:
            print("waiting", flush=True)
            time.sleep(600)
        return fetch(*args)
    distributed.host_local_batch_to_global = fetch_and_wait
cfg = tiny_config("softmax", sys.argv[2], **{"train.checkpoint_every": 2, "optim.schedule": "constant",
                                             "train.eval_every": 100, "train.steps": 8})
loop.train_and_evaluate(cfg, sys.argv[1])
"""


def _child(workdir, text_glob, point):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}  # with the session's compilation cache (conftest)
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(workdir), text_glob, point], stdout=subprocess.PIPE, text=True, env=env
    )


@pytest.mark.slow
def test_kill_9_during_an_async_save_resumes_exactly(runs, text_glob, tmp_path):
    child = _child(tmp_path, text_glob, "async save")
    assert child.wait(timeout=300) == -signal.SIGKILL
    loop.train_and_evaluate(_cfg(text_glob, 8), tmp_path)
    _assert_replays_exactly(tmp_path, runs[1])


@pytest.mark.slow
def test_kill_9_between_checkpoints_resumes_exactly_and_the_lock_named_the_killed_process(runs, text_glob, tmp_path):
    child = _child(tmp_path, text_glob, "between checkpoints")
    try:
        assert "waiting" in iter(lambda: child.stdout.readline().strip(), "")  # its progress lines come first
        with pytest.raises(lock.WorkdirBusyError, match=f"in use by pid {child.pid} on host {socket.gethostname()};"):
            loop.train_and_evaluate(_cfg(text_glob, 8), tmp_path)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    loop.train_and_evaluate(_cfg(text_glob, 8), tmp_path)  # the kernel released the killed holder's lock
    _assert_replays_exactly(tmp_path, runs[1])


# --- bad inputs: one `error:` line and a non-zero exit, from every entry point -------------------------------------


def _bad_data(tmp_path, kind) -> str:
    """A data glob whose file is latin-1 text, binary bytes, a shard with a token id past GPT-2's vocabulary, short or
    empty text, a 12-byte shard; or a file where a folder should be."""
    path = tmp_path / (f"{kind}.bin" if kind in ("shard", "tiny_shard") else f"{kind}.txt")
    contents = {
        "latin-1": "caf\xe9 au lait\n".encode("latin-1") * 50,
        "binary": bytes(range(256)) * 4,
        "short": b"x" * 2000,
        "empty": b"",
        "tiny_shard": b"\0" * 12,
        "file": b"",
    }
    if kind == "shard":
        shards.write_shard(path, np.r_[np.arange(100), 60000, np.arange(100)])
    else:
        path.write_bytes(contents[kind])
    return str(path)


TRAIN = ["--config=softmax:tiny", "--config.mesh.shape=(1,1,1)", "--config.train.steps=2"]
BAD_TRAIN = {  # arguments after TRAIN and --workdir -> what the one line must contain
    "missing config file": (["--config=/no/such/config.py"], "cannot load the config file: [Errno 2] No such file"),
    "unknown config name": (
        ["--config=nosuch:tiny"],
        "packaged configs: lm:variant=V,size=S or V:S, mqar:variant=V,form=F; variants: softmax, ssmax, lssa, lssar",
    ),
    "unknown size": (["--config=lssar:huge"], "unknown model size 'huge'; valid sizes: tiny"),
    "misspelt field": (
        ["--config.train.stpes=3"],
        "--config.train.stpes: no such config field; did you mean --config.train.steps?",
    ),
    "misspelt section": (
        ["--config.trian.steps=3"],
        "--config.trian.steps: no such config field; did you mean --config.train.steps?",
    ),
    "bad integer": (["--config.train.steps=abc"], "--config.train.steps=abc: invalid literal"),
    "zero steps": (["--config.train.steps=0"], "config.train.steps=0 is invalid; allowed: an integer >= 1"),
    "lr inf": (["--config.optim.lr=inf"], "config.optim.lr=inf is invalid; allowed: a finite number > 0"),
    "lr nan": (["--config.optim.lr=nan"], "config.optim.lr=nan is invalid"),
    "lr 0": (["--config.optim.lr=0"], "config.optim.lr=0.0 is invalid"),
    "lr negative": (["--config.optim.lr=-1"], "config.optim.lr=-1.0 is invalid"),
    "unknown variant": (["--config.model.attention=nope"], "config.model.attention='nope' is invalid"),
    "bad encoding": (["--config.data.encoding=klingon"], "config.data.encoding='klingon' is invalid"),
    "no data": (["--config.data.source=text", "--config.data.path=/no/such/*.txt"], "matches no file"),
    "latin-1 text": (["--config.data.source=text", "--config.data.path={latin-1}"], "latin-1.txt: not valid utf-8 at byte 3"),
    "binary text": (["--config.data.source=text", "--config.data.path={binary}"], "binary.txt: not valid utf-8 at byte 128"),
    "token past the vocabulary": (
        ["--config.data.source=bin", "--config.data.path={shard}"],
        "shard.bin: token id 60000 at token offset 100 (byte 1224) is outside the vocabulary of 50257",
    ),
    "stray argument": (["extra"], "unexpected arguments: extra"),
    "lssar p -3": (["--config=lssar:tiny", "--config.model.attention_options.p=-3"], "p must be > 0 and finite, got -3.0"),
    "lssar p 0": (
        ["--config=lssar:tiny", "--config.model.attention_options.p=0"],
        "config.model.attention_options: p must be > 0",
    ),
    "lssar p nan": (["--config=lssar:tiny", "--config.model.attention_options.p=nan"], "p must be > 0 and finite, got nan"),
    "val_fraction 0": (["--config.data.val_fraction=0"], "config.data.val_fraction=0.0 is invalid; allowed: a number in (0, 1)"),
    "spike factor 1": (
        ["--config.train.spike_factor=1"],
        "config.train.spike_factor=1.0 is invalid; allowed: 0 (off) or a finite",
    ),
    "seq_len longer than the data": (
        ["--config.data.source=text", "--config.data.path={short}", "--config.train.seq_len=4096"],
        "the training data has 1900 tokens: too few for 1 window(s) of config.train.seq_len + 1 = 4097",
    ),
    "empty text file": (["--config.data.source=text", "--config.data.path={empty}"], "the training data has 0 tokens"),
    "12-byte shard": (["--config.data.source=bin", "--config.data.path={tiny_shard}"], "tiny_shard.bin: not a .bin token shard"),
    "workdir is a file": (["--workdir={file}"], "is a file; give a folder (existing or to be created)"),
    "workdir under /dev/null": (["--workdir=/dev/null/run"], "--workdir=/dev/null/run: /dev/null is not a folder"),
    "half a cluster": (
        ["--coordinator_address=localhost:1234"],
        "--coordinator_address, --num_processes and --process_id go together",
    ),
}


def test_the_train_command_keeps_the_users_compilation_cache_and_else_caches_beside_the_data(run_cli, tmp_path):
    """A compilation cache the user set (JAX_COMPILATION_CACHE_DIR; here the session's) is the one used; without one,
    compiled programs go beside the data cache (the run itself stops at its missing data)."""
    args = [*TRAIN, f"--workdir={tmp_path / 'run'}", "--config.data.source=text", "--config.data.path=/no/such/*.txt"]
    session = jax.config.jax_compilation_cache_dir
    assert session and run_cli(train_cli.main, *args)[0] == 1 and jax.config.jax_compilation_cache_dir == session
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        assert run_cli(train_cli.main, *args, f"--config.data.cache_dir={tmp_path / 'data'}")[0] == 1
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "data" / "jax_compilation_cache")
    finally:
        jax.config.update("jax_compilation_cache_dir", session)


@pytest.mark.parametrize("case", BAD_TRAIN)
def test_bad_training_input_is_one_error_line(case, run_cli, tmp_path):
    args, expected = BAD_TRAIN[case]
    (tmp_path / "data").mkdir()
    data = {
        kind: _bad_data(tmp_path / "data", kind)
        for kind in ("latin-1", "binary", "shard", "short", "empty", "tiny_shard", "file")
    }
    before = _files(tmp_path)
    config = next((a for a in args if a.startswith("--config=")), TRAIN[0])  # the case's config replaces softmax:tiny
    args = [a.format(**data) for a in args if not a.startswith("--config=")]
    code, lines = run_cli(train_cli.main, config, *TRAIN[1:], f"--workdir={tmp_path / 'run'}", *args)
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
    assert _files(tmp_path) == before and not (tmp_path / "run").exists()  # nothing written


def _missing_a_file(run6, tmp_path):
    """A copy of the run whose latest checkpoint lacks its state's _METADATA file."""
    shutil.copytree(run6, tmp_path / "broken")
    (tmp_path / "broken" / "checkpoints" / "6" / "state" / "_METADATA").unlink()
    return tmp_path / "broken"


BAD_EVAL = {  # (main, arguments, what the line must contain); {run} is a copy of the trained run
    "multipliers abc": (
        eval_cli.main,
        ["--workdir={run}", "--multipliers=abc"],
        "--multipliers=abc is invalid; allowed: integers >= 1",
    ),
    "multipliers 0": (eval_cli.main, ["--workdir={run}", "--multipliers=0"], "--multipliers=0 is invalid"),
    "multipliers -1": (eval_cli.main, ["--workdir={run}", "--multipliers=-1"], "--multipliers=-1 is invalid"),
    "depth 2": (
        eval_cli.main,
        ["--workdir={run}", "--passkey_depths=2"],
        "--passkey_depths=2 is invalid; allowed: numbers in [0, 1]",
    ),
    "eval, no checkpoint": (eval_cli.main, ["--workdir={empty}"], "no checkpoint in"),
    "eval, no such folder": (eval_cli.main, ["--workdir={missing}"], "missing: no such folder"),
    "eval, checkpoint missing a file": (eval_cli.main, ["--workdir={broken}"], "checkpoint step 6 in"),
    "generate, checkpoint missing a file": (generate_cli.main, ["--workdir={broken}", "--prompt=hi"], "checkpoint step 6 in"),
    "generate, no prompt": (generate_cli.main, ["--workdir={broken}"], "--prompt must have a value"),
    "generate, no checkpoint": (generate_cli.main, ["--workdir={empty}", "--prompt=x"], "no checkpoint in"),
    "generate, a step not saved": (generate_cli.main, ["--workdir={run}", "--prompt=x", "--step=7"], "checkpoint step 7 in"),
    "eval, checkpoint not what was saved": (eval_cli.main, ["--workdir={tampered}"], "differs from its fingerprint"),
    "switch p=-3": (
        eval_cli.main,
        ["--workdir={run}", "--switch=p=-3"],
        "--switch=p=-3 is invalid: p=-3; allowed: a number > 0 or off",
    ),
    "switch rope_theta=0x": (eval_cli.main, ["--workdir={run}", "--switch=rope_theta=0x"], "--switch=rope_theta=0x is invalid"),
    "switch rope_linear=0": (
        eval_cli.main,
        ["--workdir={run}", "--switch=rope_linear=0"],
        "--switch=rope_linear=0 is invalid: rope_linear=0; allowed: a finite number > 0",
    ),
    "switch q=1": (eval_cli.main, ["--workdir={run}", "--switch=q=1"], "--switch=q=1 is invalid: unknown switch 'q'"),
    "implementation fast": (
        eval_cli.main,
        ["--workdir={run}", "--implementation=fast"],
        "--implementation=fast: value should be one of <reference|blockwise|pallas|auto>",
    ),
}


@pytest.mark.parametrize("case", BAD_EVAL)
def test_bad_eval_or_generate_input_is_one_error_line(case, run_cli, run6, tmp_path):
    main, args, expected = BAD_EVAL[case]
    paths = {
        "run": run6,
        "empty": tmp_path / "empty",
        "missing": tmp_path / "missing",
        "broken": _missing_a_file(run6, tmp_path),
        "tampered": tmp_path / "tampered",
    }
    paths["empty"].mkdir()
    shutil.copytree(run6, paths["tampered"])
    _another_steps_state(paths["tampered"] / "checkpoints" / "6")
    defaults = [f"--out={tmp_path / 'out'}"] if main is eval_cli.main else []
    code, lines = run_cli(main, *defaults, *(a.format(**paths) for a in args))
    errors = [line for line in lines if line.startswith("error: ")]  # eval's progress bar may come before
    assert code == 1 and errors == lines[-1:] and expected in errors[0] and not any("Traceback" in line for line in lines), lines


def test_verbosity_shows_the_traceback(run_cli, tmp_path):
    with pytest.raises(Exception, match="unknown model size 'huge'"):
        run_cli(train_cli.main, "--config=lssar:huge", f"--workdir={tmp_path}", "--verbosity=1")
