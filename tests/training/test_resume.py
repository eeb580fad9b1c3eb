"""training/resume.py's policy, called directly on a tiny run folder (checkpoints 2, 4 and 6 of a toy state and data
iterator, 4 confirmed): which checkpoint a rerun continues from when the latest is damaged, unreadable or every one
is bad, and whether the config and the data files let it resume."""

import dataclasses
import functools
import json
import os
import pathlib
import re
import shutil
import types

import grain
import jax
import numpy as np
import pytest
from helpers import tiny_config

from freeatten_jax.data import DataError
from freeatten_jax.errors import ConfigError
from freeatten_jax.training import checkpoint, config, resume

SOURCE = {"model": {"width": 8}, "data": {"path": "a.txt"}, "train": {"seq_len": 16, "steps": 6}, "optim": {"lr": 0.01}}
FILES = [["a.txt", 100, "0123456789abcdef"]]  # integrity.files of the run's data when it saved
SAVING = types.SimpleNamespace(max_to_keep=None, async_save=False)


def _cfg(source=SOURCE, allow_changed=False, allow_fresh_start=False):
    """The config fields resume reads."""
    return types.SimpleNamespace(
        source=source,
        data=types.SimpleNamespace(allow_changed=allow_changed),
        checkpoint=types.SimpleNamespace(allow_fresh_start=allow_fresh_start),
    )


def _state(step):
    return {"params": {"w": np.random.default_rng(step).normal(size=4096).astype(np.float32)}}


def _iterator():
    return iter(grain.MapDataset.range(100).to_iter_dataset())


@pytest.fixture
def run(tmp_path):
    """A run folder whose checkpoints 2, 4 and 6 each follow their step's batch; 4 is confirmed good."""
    ckpt, iterator = checkpoint.Checkpointer(tmp_path, SAVING, data_files=FILES), _iterator()
    for step in range(1, 7):
        next(iterator)
        if step % 2 == 0:
            ckpt.save(step, _state(step), iterator, SOURCE)
    ckpt.confirm(4)
    ckpt.close()
    return tmp_path


def _resume(workdir, cfg=None, files=FILES):
    """resume.resume as the loop calls it: (state, step, the next batch index of the restored iterator)."""
    ckpt, iterator = checkpoint.Checkpointer(workdir, SAVING, data_files=files), _iterator()
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _state(0))
    try:
        state, step = resume.resume(ckpt, abstract, iterator, cfg or _cfg(), workdir)
    finally:
        ckpt.close()
    return state, step, next(iterator)


def _files(folder: pathlib.Path) -> dict:
    """{relative path: bytes} of every file under `folder` (links as their targets' names)."""
    return {
        str(p.relative_to(folder)): (os.readlink(p) if p.is_symlink() else p.read_bytes())
        for p in sorted(folder.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def _largest(folder: pathlib.Path) -> pathlib.Path:
    return max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _flip_bytes(step: pathlib.Path) -> None:
    """64 bytes of an array file inverted (a storage bit rot): the store's decoding rejects them when they fall in a
    compressed chunk's framing, the fingerprints when they decode to other values."""
    path = _largest(step / "state")
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 2
    raw[middle : middle + 64] = bytes(b ^ 0xFF for b in raw[middle : middle + 64])
    path.write_bytes(bytes(raw))


def _edit_next_index(step: pathlib.Path) -> None:
    path = step / "data" / "process_0-of-1.json"
    saved = json.loads(path.read_text())
    saved["next_index"] += 1
    path.write_text(json.dumps(saved))


def _another_steps_state(step: pathlib.Path) -> None:
    shutil.rmtree(step / "state")
    shutil.copytree(step.parent / "4" / "state", step / "state")  # a whole, readable state: of step 4, not 6


def _garbage(step: pathlib.Path) -> None:
    for p in (step / "state").rglob("*"):
        if p.is_file():
            p.write_bytes(os.urandom(p.stat().st_size))


DAMAGE = {  # name: (damage, the reasons it may be quarantined for)
    "truncated file": (
        lambda step: (f := _largest(step / "state")).write_bytes(f.read_bytes()[: f.stat().st_size // 2]),
        ("unreadable",),
    ),
    "missing _METADATA": (lambda step: (step / "state" / "_METADATA").unlink(), ("unreadable",)),
    "garbage": (_garbage, ("unreadable",)),
    "empty step folder": (lambda step: [shutil.rmtree(step), step.mkdir()], ("unreadable",)),
    "edited next_index": (_edit_next_index, ("fingerprint-mismatch",)),
    "another step's state": (_another_steps_state, ("fingerprint-mismatch",)),
    "flipped array bytes": (_flip_bytes, ("unreadable", "fingerprint-mismatch")),
}
NOTICES = {
    "unreadable": "checkpoint 6 is unreadable (",
    "fingerprint-mismatch": "checkpoint 6 is not what was saved: it does not match its fingerprints (",
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_latest_checkpoint_is_moved_aside_and_the_one_before_is_resumed(damage, run, capsys):
    corrupt, reasons = DAMAGE[damage]
    corrupt(run / "checkpoints" / "6")
    state, step, next_batch = _resume(run)
    assert step == 4 and next_batch == 4
    np.testing.assert_array_equal(state["params"]["w"], _state(4)["params"]["w"])
    out = capsys.readouterr().out
    assert f"resumed from step 4 (checkpoint in {run}; confirmed good)" in out
    notices = [line for line in out.splitlines() if line.startswith("checkpoint 6 is ")]
    assert len(notices) == 1 and notices[0].endswith("continuing from step 4"), out
    matching = [reason for reason in reasons if notices[0].startswith(NOTICES[reason])]
    assert len(matching) == 1, out
    assert [p.name for p in (run / "quarantine").iterdir()] == [f"step_6-{matching[0]}"]


def test_a_sound_latest_checkpoint_resumes_and_a_damaged_confirmed_json_only_leaves_it_unconfirmed(run, capsys, caplog):
    state, step, next_batch = _resume(run)
    assert (step, next_batch) == (
        6,
        6,
    ) and f"resumed from step 6 (checkpoint in {run}; not yet confirmed" in capsys.readouterr().out
    np.testing.assert_array_equal(state["params"]["w"], _state(6)["params"]["w"])
    (run / "confirmed.json").write_text("")  # torn
    assert _resume(run)[1] == 6 and "confirmed.json is damaged" in caplog.text
    assert not (run / "quarantine").exists()


def test_when_every_checkpoint_is_bad_a_rerun_does_not_start_from_scratch_unless_asked(run, capsys):
    for step in (2, 4, 6):
        _garbage(run / "checkpoints" / str(step))
    refusal = "no usable checkpoint in .*; not starting from scratch: rerun with --config.checkpoint.allow_fresh_start=True"
    with pytest.raises(resume.NoUsableCheckpointError, match=refusal):
        _resume(run)
    assert sorted(p.name for p in (run / "quarantine").iterdir()) == [f"step_{s}-unreadable" for s in (2, 4, 6)]
    assert len([line for line in capsys.readouterr().out.splitlines() if "is unreadable" in line]) == 3
    with pytest.raises(resume.NoUsableCheckpointError, match=refusal):  # the next rerun does not start from scratch either
        _resume(run)
    state, step, _ = _resume(run, _cfg(allow_fresh_start=True))
    assert (state, step) == (None, 0)
    assert "starting from scratch (config.checkpoint.allow_fresh_start)" in capsys.readouterr().out


def test_unreadable_checkpoints_stop_the_resume_and_nothing_is_moved_or_written(run):
    """An I/O error on every checkpoint (the kernel's EIO: each one's largest file is a link to /proc/self/mem, which
    root cannot read either) is the storage's fault: no quarantine, nothing written; with the storage back, it resumes."""
    aside = {}
    for step in (2, 4, 6):
        largest = _largest(run / "checkpoints" / str(step))
        aside[largest] = largest.read_bytes()
        largest.unlink()
        largest.symlink_to("/proc/self/mem")
    before = _files(run)
    with pytest.raises(checkpoint.CheckpointUnavailableError) as err:
        _resume(run)
    message = str(err.value)
    assert message.startswith("cannot read checkpoint step 6 (") and "Input/output error" in message, message
    assert message.endswith("nothing was moved or written: fix the storage or its permissions and rerun")
    assert _files(run) == before and not (run / "quarantine").exists()
    for path, contents in aside.items():
        path.unlink()
        path.write_bytes(contents)
    assert _resume(run)[1] == 6


def test_resuming_on_changed_data_is_refused_unless_allowed(run, capsys):
    changed = [["a.txt", 117, "0123456789abcdef"]]
    before = _files(run)
    with pytest.raises(
        DataError,
        match=r"^the training data changed since checkpoint step 6: a.txt was 100 bytes, now 117; .* "
        r"--config.data.allow_changed=True to go on with this data$",
    ):
        _resume(run, files=changed)
    assert _files(run) == before
    assert _resume(run, _cfg(allow_changed=True), files=changed)[1] == 6
    assert "the training data changed since checkpoint step 6 (a.txt was 100 bytes, now 117); going on" in capsys.readouterr().out


def test_resuming_with_another_model_or_data_stream_is_refused_and_more_steps_are_not(run):
    other = json.loads(json.dumps(SOURCE))
    other["model"]["width"], other["train"]["seq_len"] = 16, 32
    with pytest.raises(
        ConfigError,
        match=rf"^config.model.width is 16 but the checkpoint at step 6 in {run} used 8; also changed: config.train.seq_len;",
    ):
        _resume(run, _cfg(other))
    saved = {"model": {"max_len": 16}, "train": {"seq_len": 16}}  # max_len follows seq_len: the user's field is named
    longer = {"model": {"max_len": 32}, "train": {"seq_len": 32}}
    with pytest.raises(
        ConfigError,
        match=r"^config.train.seq_len is 32 but the checkpoint at step 6 in wd used 16; also changed: config.model.max_len;",
    ):
        resume.check_resumable(saved, _cfg(longer), 6, "wd")
    longer = json.loads(json.dumps(SOURCE))
    longer["train"]["steps"], longer["optim"]["lr"] = 12, 0.1
    assert _resume(run, _cfg(longer))[1] == 6


def test_resume_check_refuses_each_fixed_field_and_allows_the_others(text_glob):
    """Every model.* and data.* field, train.seq_len, train.batch_size and train.seed shape the state or the
    data stream: changing one alone is refused, naming it; schedule, logging and optimiser fields may change."""
    cfg = config.parse(tiny_config("softmax", text_glob))
    fields = sorted(resume.flat_fields(cfg.source))
    fixed = [k for k in fields if k.split(".")[0] in ("model", "data") and k != "data.allow_changed"]
    fixed += ["train.seq_len", "train.batch_size", "train.seed"]
    assert len(fixed) > 20 and "data.path" in fixed and "model.attention" in fixed
    free = [
        "train.steps",
        "train.log_every",
        "train.eval_every",
        "train.checkpoint_every",
        "optim.lr",
        "optim.warmup_steps",
        "checkpoint.max_to_keep",
        "mesh.shape",
        "data.allow_changed",
        "train.spike_factor",
    ]

    def changed(field):
        source = json.loads(json.dumps(cfg.source))
        *sections, name = field.split(".")
        parent = functools.reduce(lambda d, key: d[key], sections, source)
        parent[name] = ["changed", parent[name]]
        return dataclasses.replace(cfg, source=source)

    for field in fixed:
        with pytest.raises(
            ConfigError, match=rf"^config\.{re.escape(field)} is .* checkpoint at step 2 in wd used [^;]*; resume with"
        ):
            resume.check_resumable(cfg.source, changed(field), 2, "wd")
    for field in free:
        resume.check_resumable(cfg.source, changed(field), 2, "wd")
    resume.check_resumable(cfg.source, cfg, 2, "wd")
    moved = changed("data.path")  # data.allow_changed also lets the data's paths change
    allowed = dataclasses.replace(moved, data=dataclasses.replace(cfg.data, allow_changed=True))
    resume.check_resumable(cfg.source, allowed, 2, "wd")
