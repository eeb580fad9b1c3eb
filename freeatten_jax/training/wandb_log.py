"""Weights & Biases beside metrics.jsonl and TensorBoard (train.wandb_project set; the [wandb] extra): the same
metrics at the same steps, one W&B run per workdir, the same run resumed on restart (its id kept in WORKDIR/wandb.json).

Offline (WANDB_MODE=offline) the run is written under WORKDIR/wandb/ for a later `wandb sync`. After a resume the steps
between the restored checkpoint and the interruption are logged again; W&B keeps a run's steps increasing, so it
shows the first values of those steps.
"""

import json
import secrets

from freeatten_jax.errors import ConfigError
from freeatten_jax.training import storage

RUN_FILE = "wandb.json"


class WandbLog:
    """A sink of MetricsWriter: `log(step, metrics)` and `close()` on one W&B run."""

    def __init__(self, workdir, project: str, entity: str, name: str, config: dict | None):
        import wandb  # installed: the config's check said so

        folder = storage.path(workdir)
        if not storage.is_local(folder):
            raise ConfigError(f"config.train.wandb_project={project}: W&B writes its files locally; use a local --workdir")
        saved = folder / RUN_FILE
        run_id = json.loads(saved.read_text())["id"] if saved.exists() else secrets.token_hex(4)
        self.run = wandb.init(
            project=project, entity=entity or None, name=name or None, id=run_id, resume="allow", dir=str(folder), config=config
        )
        storage.write_atomic(saved, json.dumps({"id": run_id, "project": project, "entity": entity}) + "\n")

    def log(self, step: int, metrics: dict) -> None:
        self.run.log(dict(metrics), step=step, commit=True)

    def close(self) -> None:
        self.run.finish()


def sinks(workdir, train, config: dict | None) -> list[WandbLog]:
    """MetricsWriter's further loggers: W&B's where train.wandb_project is set, else none."""
    return (
        [WandbLog(workdir, train.wandb_project, train.wandb_entity, train.wandb_run_name, config)] if train.wandb_project else []
    )
