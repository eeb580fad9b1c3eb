"""Metrics to WORKDIR/metrics.jsonl (one JSON object per line) and TensorBoard; only process 0 writes.

Local JSONL lines are appended (a crash can tear at most the last line); on resume the file is rewritten once,
atomically, keeping the step records up to the restored step. WORKDIR may be a cloud path: there the file is
rewritten whole (object stores cannot append), and TensorBoard events to `gs://` go through `etils.epath` as
well (tensorboardX's own GCS writer needs google-cloud-storage).
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


def _tensorboard(directory) -> SummaryWriter:
    """A SummaryWriter; a `gs://` folder first gets the epath writer (registered then, not at import: a module that is
    only imported changes no other library's state)."""
    if str(directory).startswith("gs://"):
        record_writer.register_writer_factory("gs", _EpathWriterFactory())
    return SummaryWriter(str(directory))


def _parsed(path) -> list[tuple[str, dict]]:
    """(line, row) for each step record; anything else (a line torn by a crash, other JSON, binary bytes) is dropped
    with a warning."""
    rows = []
    for number, line in enumerate(path.read_bytes().decode("utf-8", errors="replace").splitlines(), 1):
        try:
            row = json.loads(line)
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows.append((line, row))
                continue
            why = "not a step record"
        except json.JSONDecodeError:
            why = "not whole JSON (a write cut short?)"
        if line.strip():
            logging.warning("%s: dropped line %d, which is %s: %.80r", path, number, why, line)
    return rows


class MetricsWriter:
    """Appends {step, ...} lines; on resume, drops lines past the restored step (and bad ones) so that the file
    holds each step once."""

    def __init__(self, workdir, resumed_step: int = 0, config: dict | None = None, sinks=lambda: ()):
        """sinks() -> further loggers (log(step, metrics), close()), made on process 0 only: W&B's (wandb_log)."""
        self.enabled = jax.process_index() == 0
        self._sinks: tuple = ()
        self.path = storage.path(workdir) / "metrics.jsonl"
        self._tb, self._lines, self.rows = None, [], []  # rows: the records kept (process 0)
        if self.enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                kept = [(line, row) for line, row in _parsed(self.path) if row["step"] <= resumed_step]
                self._lines, self.rows = [line for line, _ in kept], [row for _, row in kept]
            storage.write_atomic(self.path, "".join(line + "\n" for line in self._lines))
            self._tb = _tensorboard(storage.path(workdir) / "tensorboard")
            if config is not None:  # the run's config, readable in TensorBoard's text tab
                self._tb.add_text("config", "```\n" + json.dumps(config, indent=1) + "\n```", resumed_step)
            self._sinks = tuple(sinks())

    def write(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        line = json.dumps({"step": step, **metrics})
        if storage.is_local(self.path):
            with open(self.path, "a") as f:
                f.write(line + "\n")
        else:
            self._lines.append(line)
            self.path.write_text("".join(line + "\n" for line in self._lines))
        for name, value in metrics.items():
            self._tb.add_scalar(name, value, step)
        self._tb.flush()
        for sink in self._sinks:
            sink.log(step, metrics)

    def close(self) -> None:
        for sink in self._sinks:
            sink.close()
        if self._tb is not None:
            try:
                self._tb.close()
            except OSError as e:  # a full disk: the error that stopped the run says so; the events' tail is lost
                logging.warning("TensorBoard events not flushed: %s", e)
