"""An evaluation's finished measurements ("cells"), kept so that a rerun of an interrupted evaluation skips them: each
cell is one JSON file, OUT/cells/JOB/NAME.json, written atomically as it completes (a kill loses at most the cell in
progress); JOB is one checkpoint at its step under one switch, and its `run` cell is the whole result once it is done.
OUT/cells/settings.json holds the settings the cells were measured under."""

import hashlib
import json
import os
import pathlib

from freeatten_jax.training import storage

FOLDER = "cells"
RUN = "run"  # the cell holding a job's whole result


def job_name(workdir: str, step: int, switch: str) -> str:
    """A job's folder: the run's name, the checkpoint's step and the switch, and a hash that tells apart runs of one
    name in different folders."""
    workdir = os.path.abspath(workdir)
    digest = hashlib.sha1(f"{workdir}\n{step}\n{switch}".encode()).hexdigest()[:10]
    return f"{pathlib.Path(workdir).name}@{step}[{switch}]-{digest}".replace(os.sep, "_")


def saved_settings(out: pathlib.Path) -> dict | None:
    """The settings the cells in `out` were measured under (None: none measured yet)."""
    try:
        return json.loads((out / FOLDER / "settings.json").read_text())
    except FileNotFoundError:
        return None


def save_settings(out: pathlib.Path, settings: dict) -> None:
    (out / FOLDER).mkdir(parents=True, exist_ok=True)
    storage.write_atomic(out / FOLDER / "settings.json", json.dumps(settings, indent=1) + "\n")


class Cells:
    """The finished cells of one job in `folder`; None: none kept (each measured, none saved)."""

    def __init__(self, folder: pathlib.Path | None):
        self.folder = folder

    def get(self, name: str) -> dict | None:
        """The cell's saved payload, None if it is not done."""
        try:
            return None if self.folder is None else json.loads((self.folder / f"{name}.json").read_text())
        except FileNotFoundError:
            return None

    def put(self, name: str, payload: dict) -> dict:
        """Saves the cell; returns its payload as `get` reads it back (JSON's: tuples become lists)."""
        text = json.dumps(payload)
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            storage.write_atomic(self.folder / f"{name}.json", text)
        return json.loads(text)

    def done(self) -> int:
        """Finished cells in the folder, the whole result's not counted."""
        return sum(1 for p in self.folder.glob("*.json") if p.stem != RUN) if self.folder.is_dir() else 0


def drop_partial_writes(out: pathlib.Path) -> None:
    """Removes the temporary files of writes a kill interrupted (storage.write_atomic's), left under OUT/cells."""
    for leftover in (out / FOLDER).glob("**/.*.tmp-*"):
        leftover.unlink()
