"""Metrics to WORKDIR/metrics.jsonl (one JSON object per line) and TensorBoard; only process 0 writes.

WORKDIR may be a cloud path: the JSONL file is rewritten whole (object stores cannot append), and
TensorBoard events to `gs://` go through `etils.epath` as well (tensorboardX's own GCS writer needs
google-cloud-storage).
"""
import json

import jax
from absl import logging
from tensorboardX import SummaryWriter, record_writer

from freeatten_jax.training import storage


class _EpathRecordWriter:
    """A tensorboardX record writer that rewrites the whole event file through epath on each flush."""

    def __init__(self, path: str):
        self.path, self.buffer = storage.path(path), bytearray()

    def write(self, data: bytes) -> None:
        self.buffer += data

    def flush(self) -> None:
        self.path.write_bytes(bytes(self.buffer))

    def close(self) -> None:
        self.flush()


class _EpathWriterFactory:
    def open(self, path: str) -> _EpathRecordWriter:
        return _EpathRecordWriter(path)

    def directory_check(self, path: str) -> None:
        storage.path(path).mkdir(parents=True, exist_ok=True)


record_writer.register_writer_factory("gs", _EpathWriterFactory())


def _parsed(path) -> list[tuple[str, dict]]:
    """(line, row) for each whole line; a torn line (a crash mid-write) is dropped with a warning."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rows.append((line, json.loads(line)))
        except json.JSONDecodeError:
            if line.strip():
                logging.warning("%s: dropped line %d, which is not whole JSON (a write cut short): %.80r", path, number, line)
    return rows


class MetricsWriter:
    """Appends {step, ...} lines; on resume, drops lines past the restored step (and torn ones) so that the file
    holds each step once."""

    def __init__(self, workdir, resumed_step: int = 0, config: dict | None = None):
        self.enabled = jax.process_index() == 0
        self.path = storage.path(workdir) / "metrics.jsonl"
        self._tb, self._lines = None, []
        if self.enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                self._lines = [line for line, row in _parsed(self.path) if row["step"] <= resumed_step]
            self.path.write_text("".join(line + "\n" for line in self._lines))
            self._tb = SummaryWriter(str(storage.path(workdir) / "tensorboard"))
            if config is not None:  # the run's config, readable in TensorBoard's text tab
                self._tb.add_text("config", "```\n" + json.dumps(config, indent=1) + "\n```", resumed_step)

    def write(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        self._lines.append(json.dumps({"step": step, **metrics}))
        self.path.write_text("".join(line + "\n" for line in self._lines))
        for name, value in metrics.items():
            self._tb.add_scalar(name, value, step)
        self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(workdir) -> list[dict]:
    """The lines of WORKDIR/metrics.jsonl as dicts."""
    path = storage.path(workdir) / "metrics.jsonl"
    return [row for _, row in _parsed(path)]
