"""Metrics to WORKDIR/metrics.jsonl (one JSON object per line) and TensorBoard; only process 0 writes.

WORKDIR may be a cloud path: the JSONL file is rewritten whole (object stores cannot append), and
TensorBoard events to `gs://` go through `etils.epath` as well (tensorboardX's own GCS writer needs
google-cloud-storage).
"""
import json

import jax
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


class MetricsWriter:
    """Appends {step, ...} lines; on resume, drops lines past the restored step so the file stays one run."""

    def __init__(self, workdir, resumed_step: int = 0, config: dict | None = None):
        self.enabled = jax.process_index() == 0
        self.path = storage.path(workdir) / "metrics.jsonl"
        self._tb, self._lines = None, []
        if self.enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                self._lines = [line for line in self.path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= resumed_step]
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
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
