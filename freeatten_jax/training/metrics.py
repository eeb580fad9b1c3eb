"""Metrics to WORKDIR/metrics.jsonl (one JSON object per line) and TensorBoard; only process 0 writes.

WORKDIR may be a cloud path: the JSONL file is rewritten whole (object stores cannot append).
"""
import json

import jax

from freeatten_jax.training import storage


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
            from tensorboardX import SummaryWriter

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
