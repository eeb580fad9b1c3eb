"""Orbax checkpoints in WORKDIR/checkpoints (local or cloud): train state (params, optimizer, step, RNG
streams), the data iterator's state, the config as JSON, and their fingerprints (training.integrity); a run's
checkpoints are read without writing in training.run_dir.

A checkpoint whose content is provably bad (garbage, truncated, missing files, a fingerprint mismatch, or
the state a non-finite or diverging step was computed from) is moved aside to WORKDIR/quarantine/step_N-<reason>,
never deleted. A checkpoint that cannot be *read* (permission, I/O or network errors) is left as it is: the
storage is at fault, not the checkpoint. Rotation keeps the newest `max_to_keep` and the last confirmed one.
"""

import contextlib
import dataclasses
import errno
import json
import os
import re
import time
import uuid

import grain
import jax
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils

from freeatten_jax.errors import UserError
from freeatten_jax.formats import hf_llama
from freeatten_jax.training import config, integrity, storage
from freeatten_jax.training.progress import log

ITEMS = ("state", "data", "config", "integrity")


class CheckpointNotFoundError(UserError, FileNotFoundError):
    """A workdir holds no (readable) checkpoint."""


class CheckpointWriteError(UserError, OSError):
    """The checkpoint folder cannot be written."""


class CheckpointUnavailableError(UserError, OSError):
    """A checkpoint cannot be read (permission, I/O or network error): nothing is moved or written."""


class CheckpointMismatchError(ValueError):
    """A restored checkpoint differs from the fingerprints saved with it: its content is bad."""


# Causes that say the storage could not be read, not that the content is bad: OS errors other than a missing
# file, and the tensorstore / cloud status codes of the same (orbax wraps them in many exception types).
_CONTENT_ERRNOS = {errno.ENOENT, errno.EISDIR, errno.ENOTDIR}
_UNAVAILABLE_CODES = (
    "PERMISSION_DENIED",
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
    "UNAUTHENTICATED",
    "RESOURCE_EXHAUSTED",
    "Permission denied",
    "Input/output error",
)


def is_unavailable(error: BaseException) -> bool:
    """True when `error`, or anything it was raised from, says the storage failed to read (not that the bytes are bad)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno is not None and error.errno not in _CONTENT_ERRNOS:
            return True
        if any(code in str(error) for code in _UNAVAILABLE_CODES):
            return True
        error = error.__cause__ or error.__context__
    return False


@dataclasses.dataclass
class _KeepConfirmed:
    """An orbax preservation policy: the newest `n` checkpoints and the last confirmed one, whatever `n` is."""

    n: int | None
    confirmed: list  # [step or None], shared with the Checkpointer

    def should_preserve(self, checkpoints, *, context):
        newest = {c.step for c in checkpoints[-self.n :]} if self.n else {c.step for c in checkpoints}
        return [c.step in newest or c.step == self.confirmed[0] for c in checkpoints]


def probe_writable(directory) -> None:
    """Creates and removes a small file in `directory`, so that an unwritable folder fails in seconds, in one line
    (orbax's own failure surfaces only after its barrier times out, minutes later)."""
    probe = directory / f".write_probe-{uuid.uuid4().hex}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise CheckpointWriteError(
            f"cannot write checkpoints to {directory}: {e.strerror or e}; "
            f"make it writable or use another --workdir (the checkpoints in it are untouched)"
        ) from None


def describe(error: Exception) -> str:
    """`Type: first line` of an exception (orbax and tensorstore messages run to many lines)."""
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"


class Checkpointer:
    """An async CheckpointManager keeping the last `max_to_keep` steps."""

    def __init__(self, workdir, cfg_checkpoint=None, *, read_only: bool = False, data_files: list | None = None):
        keep = cfg_checkpoint.max_to_keep if cfg_checkpoint else None
        async_save = bool(cfg_checkpoint and cfg_checkpoint.async_save)
        self.workdir = storage.path(workdir)
        self.directory = self.workdir / "checkpoints"
        self.data_files = data_files or []  # integrity.files of the run's data, saved with each checkpoint
        self._writing, self._waited = None, False  # the step of the last save started; whether a save had to wait
        self._confirmed = [None if read_only else self.confirmed_step()]
        options = ocp.CheckpointManagerOptions(
            enable_async_checkpointing=async_save, read_only=read_only, preservation_policy=_KeepConfirmed(keep, self._confirmed)
        )
        if not read_only:
            probe_writable(self.directory)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def quarantine(self, step: int, reason: str):
        """Moves checkpoint `step` to WORKDIR/quarantine/step_N-<reason> (process 0); returns the new path."""
        self.wait()
        if self._confirmed[0] == step:
            self._confirmed[0] = None
        slug = re.sub(r"[^A-Za-z0-9]+", "-", reason).strip("-")[:60]
        target = self.workdir / "quarantine" / f"step_{step}-{slug}"
        if jax.process_index() == 0:
            target.parent.mkdir(parents=True, exist_ok=True)
            while target.exists():
                target = target.with_name(target.name + "+")
            (self.directory / str(step)).rename(target)
        if jax.process_count() > 1:  # every process sees the move before it lists the steps again (untested multi-host)
            multihost_utils.sync_global_devices(f"quarantine step {step}")
        self.manager.reload()
        return target

    def confirm(self, step: int) -> None:
        """Records that the step computed from checkpoint `step` was finite and not diverging (process 0; atomic)."""
        self._confirmed[0] = step
        if jax.process_index() == 0:
            storage.write_atomic(self.workdir / "confirmed.json", json.dumps({"step": step}) + "\n")

    def unconfirm(self) -> None:
        """Forgets the confirmed step read at the start (its confirmed.json was moved aside by a start from step 0)."""
        self._confirmed[0] = None

    def confirmed_step(self) -> int | None:
        """The newest checkpoint confirmed good by `confirm`, if any (a damaged confirmed.json confirms none)."""
        path = self.workdir / "confirmed.json"
        if not path.exists():
            return None
        try:
            step = json.loads(path.read_text())["step"]
            if isinstance(step, int):
                return step
        except (ValueError, TypeError, KeyError, UnicodeDecodeError):
            pass
        logging.warning("%s is damaged: no checkpoint counts as confirmed until the next one is", path)
        return None

    def save(self, step: int, train_state, data_iterator, source: dict) -> None:
        """Starts saving (in the background with async_save); the fingerprints are computed first, on the devices. A
        save still being written is waited for first: one at a time, so the newest whole checkpoint is at most one
        interval older than the last one due."""
        self._wait_for_the_one_before(step)
        probe_writable(self.directory)
        fingerprints = {
            "state": integrity.arrays(train_state),
            "data_iterator": integrity.iterator(data_iterator),
            "data_files": self.data_files,
        }
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(train_state),
            data=grain.checkpoint.CheckpointSave(data_iterator),
            config=ocp.args.JsonSave(source),
            integrity=ocp.args.JsonSave(fingerprints),
        )
        self._reporting(lambda: self.manager.save(step, args=args, force=True))  # it raises a previous save's failure
        self._writing = step

    def _wait_for_the_one_before(self, step: int) -> None:
        """Waits for a save still being written; the first such wait of the run is said, with how long it took."""
        if not self.saving():
            return
        began = time.perf_counter()
        self.wait()
        if not self._waited:
            self._waited = True
            log(
                f"checkpoint {step} is due while checkpoint {self._writing} is still being written: waited "
                f"{time.perf_counter() - began:.1f} s for it (the saves take longer than train.checkpoint_every steps; "
                f"at most one is written at a time; later waits are not said)"
            )

    def check_for_errors(self) -> None:
        """Raises CheckpointWriteError if a background save has failed (called before every step: a failed save stops
        the run). Orbax's finalize thread takes its commit thread's error as it ends, before the manager's own check
        can see it; once no save is in progress, waiting raises what that thread took, at once."""
        self._reporting(self.manager.check_for_errors)
        if not self.saving():
            self.wait()

    def saving(self) -> bool:
        """Whether a background save is still being written."""
        return self.manager.is_saving_in_progress()

    def _reporting(self, call) -> None:
        """Runs `call`; a failed save it re-raises (of any type: orbax passes on its save thread's) is one line."""
        try:
            call()
        except Exception as e:
            code = re.search(r"os_error_code='(\d+)'", str(e))  # tensorstore's wording of an OS error, cut off by describe
            cause = f"{os.strerror(int(code[1]))}: " if code else ""
            raise CheckpointWriteError(
                f"saving a checkpoint to {self.directory} failed ({cause}{describe(e)}); stopped; "
                f"the earlier checkpoints are kept: free space or fix the storage, then rerun"
            ) from e

    def check_readable(self, step: int) -> None:
        """Opens every file of checkpoint `step` and reads a byte: a permission or I/O error is
        CheckpointUnavailableError, before anything is moved."""
        path = self.directory / str(step)
        folders, files = [path], []
        try:
            while folders:  # epath has no recursive glob on cloud paths
                for path in folders.pop().iterdir():
                    (folders if path.is_dir() else files).append(path)
            for path in files:
                with path.open("rb") as f:
                    f.read(1)
        except OSError as e:
            if e.errno in _CONTENT_ERRNOS:
                return  # a file that vanished: the restore finds the checkpoint incomplete
            raise CheckpointUnavailableError(
                f"cannot read checkpoint step {step} ({e.filename or path}: {e.strerror or e}); nothing was moved "
                f"or written: fix the storage or its permissions and rerun"
            ) from None

    def fingerprints(self, step: int) -> dict | None:
        """The fingerprints saved with `step` (None for checkpoints saved before they existed)."""
        if not (self.directory / str(step) / "integrity").exists():
            return None
        return self.manager.restore(step, args=ocp.args.Composite(integrity=ocp.args.JsonRestore()))["integrity"]

    def restore(self, step: int, abstract_state, data_iterator, fingerprints: dict | None = None):
        """The state at `step`; `data_iterator` is moved to where it was at that step. With `fingerprints`, the
        restored arrays and iterator state are checked against them (CheckpointMismatchError names the first that differs)."""
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=grain.checkpoint.CheckpointRestore(data_iterator)
        )
        restored = self.manager.restore(step, args=args)["state"]
        if fingerprints is not None:
            arrays = integrity.arrays(restored)
            if bad := [k for k in sorted(arrays) if arrays[k] != fingerprints["state"].get(k)]:
                raise CheckpointMismatchError(
                    f"array {bad[0]} differs from its fingerprint ({len(bad)} of {len(arrays)} arrays do)"
                )
            if integrity.iterator(data_iterator) != fingerprints["data_iterator"]:
                raise CheckpointMismatchError("the data iterator's state differs from its fingerprint")
        return restored

    def config_json(self, step: int) -> dict:
        """The command line's config saved with `step`, as JSON (older versions' sentinels as None: config.upgrade)."""
        return config.upgrade(self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"])

    def run_config(self, step: int) -> config.Config:
        """The typed config of the run that saved `step`."""
        return config.parse(config.from_json(self.config_json(step)))

    def require_latest(self) -> int:
        """The latest step, or CheckpointNotFoundError (saying so when the folder is a Hugging Face model's)."""
        step = self.latest_step()
        if step is None and any((self.workdir / name).exists() for name in hf_llama.MARKERS):
            raise CheckpointNotFoundError(
                f"{self.workdir} is a Hugging Face checkpoint folder, not a run: import it first with "
                f"freeatten-import {self.workdir} --workdir=WORKDIR"
            )
        if step is None:
            raise CheckpointNotFoundError(f"no checkpoint in {self.directory}; train it first")
        return step

    def wait(self) -> None:
        self._reporting(self.manager.wait_until_finished)

    def close(self) -> None:
        """Waits for the background save and closes; a failed save is CheckpointWriteError, after closing all the same
        (orbax reports a failure once: the second close finishes what the first left)."""
        try:
            self._reporting(self.manager.close)
        except CheckpointWriteError:
            with contextlib.suppress(Exception):
                self.manager.close()
            raise
