"""Two JAX processes x 4 CPU devices (gloo collectives) against one process x 8 devices: the same losses, the lock
held by process 0, each process's own data shard and iterator state, a kill -9 of one process (the other stops by
itself, in one line), and a resume of both from the checkpoint before."""

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import read_metrics, subprocess_env, tiny_config

from freeatten_jax import data
from freeatten_jax.errors import EXIT_PEER_LOST
from freeatten_jax.training import distributed, loop

STEPS = {
    "train.checkpoint_every": 3,
    "optim.schedule": "constant",
    "train.eval_every": 100,
    "train.steps": 6,
    "mesh.shape": (-1, 1, 1),
}

_PROCESS = """
import os, sys, time
sys.path.insert(0, "tests")
from helpers import tiny_config
from test_multihost import STEPS
from freeatten_jax.training import distributed, loop
workdir, text_glob, port, process, wait_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
if wait_at:  # process 1 stops while fetching that batch, once the checkpoint before it is written, for the test's kill -9
    fetch, calls = distributed.host_local_batch_to_global, []
    def fetch_or_wait(*args):
        calls.append(1)
        if len(calls) == wait_at:
            while not os.path.isdir(os.path.join(workdir, "checkpoints", str(wait_at - 1))):
                time.sleep(0.1)
            print("waiting", flush=True)
            time.sleep(600)
        return fetch(*args)
    distributed.host_local_batch_to_global = fetch_or_wait
cluster = distributed.Cluster(f"localhost:{port}", 2, process, peer_timeout_s=5)
loop.train_and_evaluate(tiny_config("softmax", text_glob, **STEPS), workdir, cluster)
"""


def _launch(workdir, text_glob, port, wait_at=0):
    """Processes 0 and 1 of a run, each with 4 CPU devices; their output goes to files beside the workdir."""
    env = subprocess_env(4, JAX_PLATFORMS="cpu", PYTHONPATH=os.getcwd())
    procs = []
    for process in (0, 1):
        log = open(workdir.parent / f"process{process}-{port}.log", "w")
        args = [
            sys.executable,
            "-c",
            _PROCESS,
            str(workdir),
            text_glob,
            str(port),
            str(process),
            str(wait_at if process == 1 else 0),
        ]
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


@pytest.mark.slow
def test_two_processes_match_one_and_survive_a_kill_9_of_one_then_resume(text_glob, tmp_path):
    straight = loop.train_and_evaluate(tiny_config("softmax", text_glob, **STEPS), tmp_path / "one")  # 1 process x 8 devices
    workdir = tmp_path / "two"
    (p0, log0), (p1, log1) = procs = _launch(workdir, text_glob, _free_port(), wait_at=4)
    try:
        deadline = time.monotonic() + 300  # process 1 waits at batch 4, after checkpoint 3
        while "waiting" not in _lines(log1) and p1.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "waiting" in _lines(log1), _lines(log1)[-20:]
        assert (workdir / "lock").read_text().startswith(f"pid {p0.pid} on host ")  # process 0 holds the lock, alone
        p1.send_signal(signal.SIGKILL)
        assert p0.wait(timeout=60) == EXIT_PEER_LOST  # by itself, within peer_timeout_s (5 s) plus a poll
        errors = [line for line in _lines(log0) if line.startswith("error: ")]
        assert errors == [
            f"error: process 1 of 2 has not been heard from for 5 s: it died or hangs; stopping this process too "
            f"(exit {EXIT_PEER_LOST}): restart every process to resume from the last checkpoint"
        ], _lines(log0)[-20:]
        assert sorted(p.name for p in (workdir / "checkpoints" / "3" / "data").glob("process_*")) == [
            "process_0-of-2.json",
            "process_1-of-2.json",
        ]
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    resumed = _launch(workdir, text_glob, _free_port())
    assert [p.wait(timeout=300) for p, _ in resumed] == [0, 0], _lines(resumed[0][1])[-20:] + _lines(resumed[1][1])[-20:]
    assert "resumed from step 3" in "\n".join(_lines(resumed[0][1]))
    two = read_metrics(workdir)
    assert [m["step"] for m in two] == list(range(1, 7))
    np.testing.assert_allclose([m["loss"] for m in two], [m["loss"] for m in straight], rtol=1e-5)
    np.testing.assert_allclose(two[-1]["val_loss"], straight[-1]["val_loss"], rtol=1e-5)
