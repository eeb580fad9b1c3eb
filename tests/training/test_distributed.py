"""Two JAX processes x 4 CPU devices (gloo collectives), each run as the train command, against one process x 8
devices: the same losses, the lock held by process 0, each process's own data shard and iterator state; a kill -9 of
process 1 (process 0 stops by itself, in one line) or of process 0, the coordinator (process 1 stops, aborted by jax
or in PeerWatch's one line, whichever sees it first), and a resume of both from the checkpoint before; a process
that cannot reach the workdir (both stop, one line each). The same kills, and a SIGTERM of one process, with the
'context' axis across both processes (the ring's collectives cross them). An evaluation refuses to span processes."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import read_metrics, subprocess_env, tiny_config

from freeatten_jax import data
from freeatten_jax.errors import EXIT_PEER_LOST, EXIT_PREEMPTED
from freeatten_jax.training import distributed

STEPS = {
    "train.checkpoint_every": 3,
    "optim.schedule": "constant",
    "train.eval_every": 100,
    "train.steps": 6,
    "mesh.shape": (-1, 1, 1),
}
# the layouts: data parallel over the processes, or one 'context' axis of 8 devices spanning both (the ring's steps
# from device 3 to 4 and from 7 to 0 cross processes)
LAYOUTS = {"data": ("softmax", STEPS), "context": ("lssar", {**STEPS, "mesh.shape": (1, 1, 1, 8)})}

_PROCESS = """
import os, signal, sys, time
sys.path.insert(0, "tests")
from freeatten_jax import attention
from freeatten_jax.cli import train as cli
from freeatten_jax.training import distributed
workdir, config, port, process, wait_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
if sys.argv[6] == "bound" and os.geteuid() == 0:  # root gives up CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH: permission bits bind
    import ctypes
    libc, header, caps = ctypes.CDLL(None, use_errno=True), (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
    libc.capget(header, caps)
    caps[0] &= ~0b110  # effective
    caps[1] &= ~0b110  # permitted
    if libc.capset(header, caps):
        raise OSError(ctypes.get_errno(), "capset")
if wait_at:  # this process stops while fetching that batch, once the checkpoint before it is written, for the test's
    fetch, calls = distributed.host_local_batch_to_global, []  # kill -9 or SIGTERM (then it goes on)
    def fetch_or_wait(*args):
        calls.append(1)
        if len(calls) == wait_at:
            while not os.path.isdir(os.path.join(workdir, "checkpoints", str(wait_at - 1))):
                time.sleep(0.1)
            print("waiting", flush=True)
            stop, deadline = signal.getsignal(signal.SIGTERM).__self__, time.monotonic() + 600  # the loop's StopSignal
            while not stop.requested and time.monotonic() < deadline:
                time.sleep(0.1)
        return fetch(*args)
    distributed.host_local_batch_to_global = fetch_or_wait
ring = attention.context_parallel_attend  # says so when the model goes round a ring (traced), so a fallback fails
def ring_and_say(*args, **options):
    print(f"ring over {options['axis_name']!r}", flush=True)
    return ring(*args, **options)
attention.context_parallel_attend = ring_and_say
sys.argv = ["train.py", f"--config={config}", f"--workdir={workdir}", f"--coordinator_address=localhost:{port}",
            "--num_processes=2", f"--process_id={process}", "--peer_timeout=5"]
cli.main()  # the train command as a user runs it: one `error:` line and its exit code
"""


def _config_file(folder, text_glob, layout) -> str:
    """A config file giving tiny_config(variant, text_glob, **steps) of LAYOUTS[layout], for the train command of each
    process."""
    path = folder / f"multihost_{layout}_cfg.py"
    path.write_text(
        "import sys\nsys.path[:0] = ['tests', 'tests/training']\n"
        "from helpers import tiny_config\nfrom test_distributed import LAYOUTS\n"
        f"def get_config():\n    variant, steps = LAYOUTS[{layout!r}]\n    return tiny_config(variant, {text_glob!r}, **steps)\n"
    )
    return str(path)


def _launch(workdir, text_glob, port, waiting=(None, 0), workdirs=None, bound=None, layout="data"):
    """Processes 0 and 1 of a run of LAYOUTS[layout] (the train command), each with 4 CPU devices; process `waiting[0]`
    waits at batch `waiting[1]` (until a SIGTERM); `workdirs` gives each process's --workdir (default: `workdir`);
    process `bound` is bound by permission bits even as root. Their output goes to files beside the workdir."""
    env = subprocess_env(4, JAX_PLATFORMS="cpu", PYTHONPATH=os.getcwd())
    config = _config_file(workdir.parent, text_glob, layout)
    procs = []
    for process in (0, 1):
        log = open(workdir.parent / f"process{process}-{port}.log", "w")
        wait_at = waiting[1] if waiting[0] == process else 0
        path = (workdirs or (workdir, workdir))[process]
        args = [sys.executable, "-c", _PROCESS, str(path), config, str(port), str(process), str(wait_at)]
        args.append("bound" if process == bound else "-")
        procs.append((subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env), log.name))
    return procs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _lines(path) -> list[str]:
    with open(path) as f:
        return [line.rstrip("\n") for line in f if not line.startswith("[Gloo]")]


def test_each_process_reads_only_its_own_windows():
    """Host h of P takes elements h, h + P, ... of the one global stream: disjoint, and together the one-process batch."""
    sequences = [np.arange(5000) % 251]
    whole = data.train_dataset(sequences, 15, 8, seed=3)[0]
    halves = [data.train_dataset(sequences, 15, 4, seed=3, process_index=h, process_count=2)[0] for h in (0, 1)]
    np.testing.assert_array_equal(halves[0], whole[0::2])
    np.testing.assert_array_equal(halves[1], whole[1::2])


def test_jax_heartbeat_cannot_beat_peer_watch():
    """jax's service flags a dead process from half its heartbeat timeout on (clients beat every half) and then aborts
    the others (SIGABRT); PeerWatch must have stopped them first, in one line: by peer_timeout_s + 2 polls of 1 s."""
    for peer_timeout_s in (1, 5, 60, 600):
        assert distributed.heartbeat_timeout_s(peer_timeout_s) / 2 >= peer_timeout_s + 2 + 3  # 3 s to spare


@pytest.fixture(scope="module")
def straight(text_glob, trained_run):
    """The metrics of each layout's run in one process x 8 devices (by layout, each trained when first asked for)."""
    runs = {}

    def get(layout):
        if layout not in runs:
            variant, steps = LAYOUTS[layout]
            runs[layout] = read_metrics(trained_run(f"multihost-straight-{layout}", tiny_config(variant, text_glob, **steps)))
        return runs[layout]

    return get


def _wait_for(line, log, process, timeout=300):
    deadline = time.monotonic() + timeout
    while line not in _lines(log) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert line in _lines(log), _lines(log)[-20:]


def _killed_at_batch_4(workdir, text_glob, killed: int, layout="data") -> tuple[int, list[str]]:
    """Starts both processes, kill -9's process `killed` while it waits at batch 4 (after checkpoint 3); the other must
    exit by itself within a minute: (its exit status, its output lines)."""
    procs = _launch(workdir, text_glob, _free_port(), waiting=(killed, 4), layout=layout)
    (victim, victim_log), (other, other_log) = procs[killed], procs[1 - killed]
    try:
        _wait_for("waiting", victim_log, victim)
        assert (workdir / "lock").read_text().startswith(f"pid {procs[0][0].pid} on host ")  # held by process 0 alone
        victim.send_signal(signal.SIGKILL)
        status = other.wait(timeout=60)
        assert sorted(p.name for p in (workdir / "checkpoints" / "3" / "data").glob("process_*")) == [
            "process_0-of-2.json",
            "process_1-of-2.json",
        ]
        return status, _lines(other_log)
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def _resume_both_exactly(workdir, text_glob, straight, layout="data", step=3) -> list[list[str]]:
    """Restarts both processes: they finish, resumed from checkpoint `step`, with the one-process run's losses; their
    lines. Where the layout has a 'context' axis, both went round its ring."""
    resumed = _launch(workdir, text_glob, _free_port(), layout=layout)
    assert [p.wait(timeout=300) for p, _ in resumed] == [0, 0], _lines(resumed[0][1])[-20:] + _lines(resumed[1][1])[-20:]
    lines = [_lines(log) for _, log in resumed]
    assert any(line.startswith(f"resumed from step {step} (checkpoint in {workdir};") for line in lines[0]), lines[0]
    assert ["ring over 'context'" in each for each in lines] == [layout == "context"] * 2
    straight = straight(layout)
    two = read_metrics(workdir)
    assert [m["step"] for m in two] == list(range(1, 7))
    np.testing.assert_allclose([m["loss"] for m in two], [m["loss"] for m in straight], rtol=1e-5)
    np.testing.assert_allclose(two[-1]["val_loss"], straight[-1]["val_loss"], rtol=1e-5)
    return lines


_RESTART = f"(exit {EXIT_PEER_LOST}): restart every process to resume from the last checkpoint"


def _as_older_versions_wrote(step):
    """Checkpoint folder `step` without its fingerprints, as versions before them saved it: no integrity item."""
    shutil.rmtree(step / "integrity")
    metadata = json.loads((step / "_CHECKPOINT_METADATA").read_text())
    del metadata["item_handlers"]["integrity"]
    (step / "_CHECKPOINT_METADATA").write_text(json.dumps(metadata))


@pytest.mark.slow
def test_two_processes_match_one_survive_a_kill_9_of_process_1_and_resume_from_a_checkpoint_without_fingerprints(
    straight, text_glob, tmp_path
):
    _stopped_as_the_table_says(*_killed_at_batch_4(tmp_path / "two", text_glob, killed=1), killed=1)
    _as_older_versions_wrote(tmp_path / "two" / "checkpoints" / "3")
    lines = _resume_both_exactly(tmp_path / "two", text_glob, straight)
    assert [[line for line in each if line.startswith("warning: checkpoint")] for each in lines] == [
        [
            "warning: checkpoint 3 has no fingerprints (an older version saved it): its arrays, data iterator and data "
            "files are not checked; the next checkpoint will have them"
        ],
        [],
    ]
    assert (tmp_path / "two" / "checkpoints" / "6" / "integrity").is_dir()


def _stopped_as_the_table_says(status: int, lines: list[str], killed: int) -> None:
    """The survivor of a kill -9 of process 1 stops in PeerWatch's one line (76). Process 0 runs jax's coordination
    service: at its kill -9 process 1 stops at once, either aborted by its jax client (SIGABRT, with jax's message;
    jaxlib 0.10 offers no hook that could print one line instead) or, when PeerWatch's poll fails first (a loaded
    machine), in PeerWatch's one line."""
    errors = [line for line in lines if line.startswith("error: ")]
    if killed == 1:
        assert status == EXIT_PEER_LOST and errors == [
            f"error: process 1 of 2 has not been heard from for 5 s: it died or hangs; stopping this process too {_RESTART}"
        ], lines[-20:]
        return
    assert status in (EXIT_PEER_LOST, -signal.SIGABRT) and len(errors) <= 1, (status, lines[-20:])
    for error in errors:  # PeerWatch's line: it may also be written just before jax's abort
        assert error.startswith("error: lost the coordination service ("), error
        assert error.endswith(f"): process 0 died or cannot be reached; stopping this process too {_RESTART}"), error
    if status == EXIT_PEER_LOST:
        assert errors, lines[-20:]
    else:
        assert any("Terminating process because the JAX distributed service detected fatal errors" in line for line in lines)


@pytest.mark.slow
def test_a_kill_9_of_process_0_the_coordinator_stops_process_1_and_both_resume_exactly(straight, text_glob, tmp_path):
    _stopped_as_the_table_says(*_killed_at_batch_4(tmp_path / "two", text_glob, killed=0), killed=0)
    _resume_both_exactly(tmp_path / "two", text_glob, straight)


@pytest.mark.slow
@pytest.mark.parametrize("killed", [1, 0])
def test_with_the_context_axis_across_both_processes_a_kill_9_of_either_stops_the_other_and_both_resume_exactly(
    killed, straight, text_glob, tmp_path
):
    """The lssar model trained with its sequence split over 8 devices, 4 in each process: the ring's collectives
    cross processes, and a dead peer stops the survivor as in data-parallel runs; restarted, both resume exactly."""
    _stopped_as_the_table_says(*_killed_at_batch_4(tmp_path / "two", text_glob, killed, layout="context"), killed)
    _resume_both_exactly(tmp_path / "two", text_glob, straight, layout="context")


@pytest.mark.slow
def test_with_the_context_axis_across_both_processes_a_sigterm_of_one_saves_and_stops_both_and_both_resume_exactly(
    straight, text_glob, tmp_path
):
    """A SIGTERM to process 1 only (waiting at batch 4, after checkpoint 3): both finish step 4, save it, say so and
    exit 75; restarted, both resume from step 4 exactly."""
    workdir = tmp_path / "two"
    procs = _launch(workdir, text_glob, _free_port(), waiting=(1, 4), layout="context")
    try:
        _wait_for("waiting", procs[1][1], procs[1][0])
        procs[1][0].send_signal(signal.SIGTERM)
        assert [p.wait(timeout=120) for p, _ in procs] == [EXIT_PREEMPTED] * 2, _lines(procs[0][1])[-20:]
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    said = [[line for line in _lines(log) if "signal" in line or "SIG" in line] for _, log in procs]
    assert said == [
        [
            "a signal to another process at step 4: saving a checkpoint, then stopping",
            "stopped at step 4 by a signal, checkpoint saved; rerun the same command to resume",
        ],
        ["SIGTERM: stopping after this step (Ctrl-C again: at once, unsaved)"],
    ], said
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["3", "4"]
    _resume_both_exactly(workdir, text_glob, straight, layout="context", step=4)


@pytest.mark.parametrize("blind", [1, 0])
def test_a_process_that_cannot_reach_the_workdir_stops_both_in_one_line_each(blind, text_glob, tmp_path):
    """Process `blind` sees the workdir through a folder it may not enter (a mount gone wrong on one host): it stops in
    one line before anything is trained; the other, already past its checks and waiting for it, stops too, in one line,
    and neither is aborted by jax (each exits with its own code)."""
    workdir, locked = tmp_path / "two", tmp_path / "locked"
    locked.mkdir()
    (locked / "two").symlink_to(workdir)
    locked.chmod(0)
    workdirs = [workdir, workdir]
    workdirs[blind] = locked / "two"
    try:
        procs = _launch(workdir, text_glob, _free_port(), workdirs=workdirs, bound=blind)
        statuses = [p.wait(timeout=120) for p, _ in procs]
    finally:
        locked.chmod(0o755)
    lines = [[line for line in _lines(log) if not line.startswith(("step ", "training ", "MFU "))] for _, log in procs]
    assert statuses[blind] == 1 and statuses[1 - blind] == EXIT_PEER_LOST, (statuses, lines)
    assert lines[blind] == [f"error: --workdir={locked / 'two'}: {locked} is not writable; use another --workdir"], lines
    assert lines[1 - blind] == [
        f"error: process {blind} of 2 stopped on an error (its own output says which); stopping this process too (exit "
        f"{EXIT_PEER_LOST}): restart every process to resume from the last checkpoint"
    ], lines
    assert not (workdir / "checkpoints").exists() or not list((workdir / "checkpoints").iterdir())


def test_an_evaluation_cannot_span_processes_and_says_so_in_one_line(run_cli, tmp_path, monkeypatch):
    """freeatten-eval has no multi-process mode (its --context splits the sequence over one host's devices): started
    by a multi-process launcher, each process would measure alone, so it refuses in one line before reading anything;
    the train command's multi-process flags are unknown to it."""
    from freeatten_jax.cli import evaluate

    args = (f"--workdir={tmp_path / 'run'}", f"--out={tmp_path / 'out'}", "--context=8")
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "localhost:1234")
    assert run_cli(evaluate.main, *args) == (
        1,
        [
            "error: freeatten-eval runs in one process, its --context over that host's devices, but "
            "JAX_COORDINATOR_ADDRESS=localhost:1234 says this job has several: run it once, on one host, outside the "
            "multi-process launcher"
        ],
    )
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS")
    assert run_cli(evaluate.main, *args, "--num_processes=2") == (1, ["error: Unknown command line flag 'num_processes'"])
    assert not (tmp_path / "out").exists()
