"""Unit tests of the reliability rules: fingerprints, the loss-spike rule, read-error classification, metrics lines,
atomic state files, shards changing under the trainer, workdir and free-space checks."""

import errno
import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import read_metrics

from freeatten_jax import data
from freeatten_jax.data import shards
from freeatten_jax.nn import sharding
from freeatten_jax.training import checkpoint, divergence, integrity, metrics, storage


def test_array_fingerprints_see_any_changed_element_and_not_the_sharding():
    rng = np.random.default_rng(0)
    tree = {
        "w": rng.normal(size=(8, 12)).astype(np.float32),
        "b": jnp.asarray(rng.normal(size=(6,)), jnp.bfloat16),
        "step": np.int32(7),
        "key": jax.random.key(3),
    }
    base = integrity.arrays(tree)
    assert set(base) == {"['w']", "['b']", "['step']", "['key']"} and all(len(v) == 16 for v in base.values())
    mesh = sharding.make_mesh((2, 2, 2), jax.devices()[:8])
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", ("fsdp", "tensor")))
    assert integrity.arrays({**tree, "w": jax.device_put(tree["w"], spec)}) == base
    for i, j in [(0, 0), (7, 11), (3, 2)]:
        flipped = tree["w"].copy()
        flipped.view(np.uint32)[i, j] ^= 1 << (i + j)  # one bit of one element
        assert integrity.arrays({**tree, "w": flipped})["['w']"] != base["['w']"]
    swapped = tree["w"].copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # same values, other places
    assert integrity.arrays({**tree, "w": swapped})["['w']"] != base["['w']"]
    assert integrity.arrays({**tree, "step": np.int32(8)})["['step']"] != base["['step']"]
    assert integrity.arrays({**tree, "key": jax.random.key(4)})["['key']"] != base["['key']"]


def test_data_file_fingerprints_name_what_changed(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"x" * 100_000)
    b.write_text("hello")
    saved = integrity.files([a, b])
    assert integrity.files_changed(saved, integrity.files([a, b])) is None
    a.write_bytes(b"x" * 50_000 + b"y" + b"x" * 49_999)  # the middle sample, same size
    assert integrity.files_changed(saved, integrity.files([a, b])) == f"{a} has other contents (same size, 100000 bytes)"
    b.write_text("hello!")
    assert integrity.files_changed(saved, integrity.files([b])) == f"{a} is gone"
    assert integrity.files_changed(saved[1:], integrity.files([a, b])) == f"{a} is new"
    assert integrity.files_changed(saved[1:], integrity.files([b])) == f"{b} was 5 bytes, now 6"


def test_spike_rule_stops_after_k_times_the_median_for_m_steps_and_ignores_short_spikes():
    rule = divergence.SpikeRule(factor=5, steps=3)
    losses = [3.0, 2.9, 2.8, 2.7, 2.6, 2.5]  # median of the first five: 2.8 -> threshold 14
    assert not any(rule.observe(s, x) for s, x in enumerate(losses, 1))
    assert rule.threshold() == pytest.approx(5 * 2.75)
    assert rule.observe(7, 14.0) and rule.observe(8, 9e3) and not rule.diverged  # two spikes ...
    assert not rule.observe(9, 2.4) and rule.run == 0  # ... then back: no divergence, and spikes stay out of the median
    assert rule.threshold() == pytest.approx(5 * 2.7)
    assert rule.observe(10, 1e4) and rule.observe(11, 1e5) and not rule.diverged and rule.observe(12, 1e6)
    assert rule.diverged and rule.first_spike == 10 and rule.run == 3
    off = divergence.SpikeRule(factor=0, steps=1)
    assert not any(off.observe(s, x) for s, x in enumerate([3.0] * 10 + [1e9], 1))
    early = divergence.SpikeRule(factor=5, steps=1)  # fewer losses than WARMUP: no threshold yet
    assert not any(early.observe(s, x) for s, x in enumerate([3.0] * (divergence.WARMUP - 1) + [1e9], 1))
    solved = divergence.SpikeRule(factor=5, steps=1)  # near 0, a spike must also rise MIN_RISE nats above the median
    assert not any(solved.observe(s, x) for s, x in enumerate([0.003] * 10 + [0.04, 0.9], 1))
    assert solved.threshold() == pytest.approx(0.003 + divergence.MIN_RISE) and solved.observe(13, 1.1) and solved.diverged


def test_read_errors_are_unavailable_and_bad_content_is_not():
    def chained(cause):
        outer = ValueError("Failed to restore")
        try:
            try:
                raise cause
            except Exception as e:
                raise outer from e
        except Exception as e:
            return e

    assert checkpoint.is_unavailable(chained(PermissionError(errno.EACCES, "Permission denied")))
    assert checkpoint.is_unavailable(chained(OSError(errno.EIO, "Input/output error")))
    assert checkpoint.is_unavailable(chained(OSError(errno.ESTALE, "Stale file handle")))  # by its errno alone
    assert checkpoint.is_unavailable(ValueError("PERMISSION_DENIED: error opening file: [OS error: Permission denied]"))
    assert checkpoint.is_unavailable(ValueError("UNAVAILABLE: GCS request failed"))
    assert not checkpoint.is_unavailable(chained(FileNotFoundError(errno.ENOENT, "No such file")))
    assert not checkpoint.is_unavailable(ValueError("DATA_LOSS: Error reading: zstd decompression failed"))
    assert not checkpoint.is_unavailable(json.JSONDecodeError("Expecting value", "x", 0))


def test_bad_metrics_lines_are_dropped_with_a_notice_and_new_lines_are_appended(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(
        b'{"step": 1, "loss": 2.0}\n{"note": "not a step"}\n[1, 2]\n\xff\xfe\x00binary\n{"step": 2, "loss": 1.0}\n{"step": 3, "lo'
    )
    with caplog.at_level(logging.WARNING):
        writer = metrics.MetricsWriter(tmp_path, resumed_step=2)
    notices = [r.getMessage() for r in caplog.records if "dropped line" in r.getMessage()]
    assert len(notices) == 4 and "not a step record" in notices[0] and "not whole JSON" in notices[-1]
    assert [m["step"] for m in read_metrics(tmp_path)] == [1, 2]
    writer.write(3, {"loss": 0.5})
    with open(path, "a") as f:  # a line the writer never saw: appending keeps it, rewriting from memory would not
        f.write('{"step": 99}\n')
    writer.write(4, {"loss": 0.4})
    writer.close()
    assert [m["step"] for m in read_metrics(tmp_path)] == [1, 2, 3, 99, 4]


def test_state_files_are_replaced_atomically_and_a_damaged_confirmed_json_confirms_nothing(tmp_path, monkeypatch, caplog):
    target = tmp_path / "confirmed.json"
    storage.write_atomic(target, '{"step": 4}\n')
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(errno.EIO, "cut")))
    with pytest.raises(OSError):
        storage.write_atomic(target, '{"step": 6}\n')  # a crash before the rename: the old file is whole
    monkeypatch.setattr(os, "replace", real)
    assert target.read_text() == '{"step": 4}\n' and os.listdir(tmp_path) == ["confirmed.json"]
    ckpt = checkpoint.Checkpointer(tmp_path)
    assert ckpt.confirmed_step() == 4
    for damaged in ("", '{"step": 6', "\x00\x00", '{"other": 1}', '{"step": "6"}'):
        target.write_text(damaged)
        assert ckpt.confirmed_step() is None
    assert "is damaged" in caplog.text
    ckpt.close()


def test_a_shard_changing_size_under_the_reader_is_one_error_not_sigbus(tmp_path):
    path = tmp_path / "a.bin"
    shards.write_shard(path, np.arange(5000) % 300)
    shard = shards.Shard(path)
    it = data.train_iterator([shard], 15, 4, seed=0)
    assert next(it).shape == (4, 16)
    np.testing.assert_array_equal(shard[10:20], np.arange(10, 20))
    os.truncate(path, shards.HEADER_BYTES + 100)
    with pytest.raises(
        data.DataChangedError, match=rf"^{path} changed while training \(it was 11024 bytes, now 1124\); stopped without saving"
    ):
        shard[4000:4016]
    with pytest.raises(data.DataChangedError, match="changed while training"):
        for _ in range(500):  # past the batches read ahead before the truncation
            next(it)
    grown = tmp_path / "b.bin"  # rewritten longer in place: every read still fills, the size tells
    shards.write_shard(grown, np.arange(5000) % 300)
    shard = shards.Shard(grown)
    with open(grown, "ab") as f:
        f.write(b"\0\0" * 10)
    with pytest.raises(data.DataChangedError, match=rf"^{grown} changed while training \(it was 11024 bytes, now 11044\)"):
        shard[0:16]


def test_the_file_watch_names_a_training_file_truncated_rewritten_at_its_size_or_removed(tmp_path):
    """What a running trainer's watch says of each change (the loop checks it between steps and before each save)."""
    path = tmp_path / "a.bin"
    changes = {
        r"it was 1000 bytes, now 300": lambda: os.truncate(path, 300),
        r"rewritten: same size, 1000 bytes, another modification time": lambda: os.utime(path, ns=(1, 1)),
        r"it is gone": path.unlink,
    }
    for what, change in changes.items():
        path.write_bytes(b"x" * 1000)
        watch = data.FileWatch([path])
        watch.check(force=True)
        change()
        with pytest.raises(data.DataChangedError, match=rf"^{path} changed while training \({what}\); stopped without saving"):
            watch.check(force=True)


@pytest.mark.parametrize("where", ["a file", "under /dev/null"])
def test_a_workdir_that_cannot_be_a_folder_is_refused(where, tmp_path):
    (tmp_path / "f").write_text("")
    workdir = {"a file": tmp_path / "f", "under /dev/null": "/dev/null/run"}[where]
    existing = {"a file": tmp_path / "f", "under /dev/null": "/dev/null"}[where]
    with pytest.raises(storage.StorageError, match=f"--workdir={workdir}: {existing} is (a file|not a folder)"):
        storage.check_workdir(workdir)
    storage.check_workdir(tmp_path / "new" / "run")


def test_free_space_check(tmp_path):
    free = storage.shutil.disk_usage(tmp_path).free
    storage.check_free_space(tmp_path / "checkpoints", free // 2)
    with pytest.raises(storage.StorageError, match=r"MiB free but a checkpoint of this run takes about"):
        storage.check_free_space(tmp_path / "checkpoints", free)
