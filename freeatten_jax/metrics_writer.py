"""Metrics to WORKDIR/metrics.jsonl (one JSON object per line) and TensorBoard; only process 0 writes."""
import json
import pathlib

import jax


class MetricsWriter:
    """Appends {step, ...} lines; on resume, drops lines past the restored step so the file stays one run."""

    def __init__(self, workdir, resumed_step: int = 0):
        self.enabled = jax.process_index() == 0
        self.path = pathlib.Path(workdir) / "metrics.jsonl"
        self._tb = None
        if self.enabled:
            self._truncate(resumed_step)
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(pathlib.Path(workdir) / "tensorboard"))

    def _truncate(self, step: int) -> None:
        if self.path.exists():
            lines = [line for line in self.path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
            self.path.write_text("".join(line + "\n" for line in lines))

    def write(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        for name, value in metrics.items():
            self._tb.add_scalar(name, value, step)
        self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(workdir) -> list[dict]:
    """The lines of WORKDIR/metrics.jsonl as dicts."""
    path = pathlib.Path(workdir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
