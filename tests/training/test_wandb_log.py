"""Weights & Biases in its offline mode: the run's project, name and config, each step's metrics, and the same run
(its id kept in the workdir) after a restart."""

import importlib.util
import json
import types

import pytest
from helpers import read_metrics, tiny_config

from freeatten_jax.errors import ConfigError
from freeatten_jax.training import storage, wandb_log

_find_spec = importlib.util.find_spec


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_a_restart_logs_to_the_same_run(offline, tmp_path):
    first = wandb_log.WandbLog(tmp_path, "proj", "", "lssar-tiny", {"train": {"steps": 4}})
    assert (first.run.project, first.run.name, first.run.config["train"]) == ("proj", "lssar-tiny", {"steps": 4})
    for step, loss in ((1, 2.5), (2, 2.0)):
        first.log(step, {"loss": loss})
        assert (first.run.summary["_step"], first.run.summary["loss"]) == (step, loss)
    first.close()
    saved = json.loads((tmp_path / wandb_log.RUN_FILE).read_text())
    again = wandb_log.WandbLog(tmp_path, "proj", "", "lssar-tiny", None)
    assert again.run.id == saved["id"] == first.run.id
    again.close()
    assert len(list((tmp_path / "wandb").glob(f"offline-run-*-{saved['id']}"))) == 2  # one folder a process, one run id


def test_a_cloud_workdir_is_refused_in_one_line(offline):
    with pytest.raises(ConfigError, match="^config.train.wandb_project=proj: W&B writes its files locally"):
        wandb_log.WandbLog("gs://bucket/run", "proj", "", "", None)
    assert not storage.is_local("gs://bucket/run")


class _Recorder:
    """wandb.init's stand-in: each run's init arguments and logged (step, metrics)."""

    def __init__(self):
        self.runs = []

    def init(self, **arguments):
        run = types.SimpleNamespace(arguments=arguments, logged=[], finished=False)
        run.log = lambda metrics, step, commit: run.logged.append((step, metrics))
        run.finish = lambda: setattr(run, "finished", True)
        self.runs.append(run)
        return run


def test_training_logs_each_metrics_row_to_wandb_and_a_resume_continues_its_run(text_glob, tmp_path, monkeypatch):
    """Through the trainer: W&B gets exactly metrics.jsonl's rows (same steps, same values), the run's config and
    name; a resumed run (more steps) logs to the same W&B run id from the restored step on."""
    import wandb

    from freeatten_jax.training import loop

    recorder = _Recorder()
    monkeypatch.setattr(wandb, "init", recorder.init)
    overrides = {"train.wandb_project": "proj", "train.wandb_run_name": "tiny", "train.checkpoint_every": 3}
    loop.train_and_evaluate(tiny_config("lssar", text_glob, **overrides), tmp_path)
    first = recorder.runs[0]
    assert first.logged == [(row["step"], {k: v for k, v in row.items() if k != "step"}) for row in read_metrics(tmp_path)]
    assert first.finished and first.arguments["project"] == "proj" and first.arguments["name"] == "tiny"
    assert first.arguments["config"]["train"]["wandb_project"] == "proj" and first.arguments["resume"] == "allow"
    loop.train_and_evaluate(tiny_config("lssar", text_glob, **overrides, **{"train.steps": 9}), tmp_path)
    again = recorder.runs[1]
    assert again.arguments["id"] == first.arguments["id"] == json.loads((tmp_path / wandb_log.RUN_FILE).read_text())["id"]
    assert [step for step, _ in again.logged] == [row["step"] for row in read_metrics(tmp_path) if row["step"] > 6]


def test_a_project_without_wandb_installed_is_a_config_error(monkeypatch):
    from freeatten_jax.configs import base
    from freeatten_jax.training import config

    cfg = base.get_config("lssar", "tiny")
    cfg.train.wandb_project = "proj"
    assert config.parse(cfg, reads_data=False).train.wandb_project == "proj"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else _find_spec(name, *a))
    with pytest.raises(
        ConfigError, match=r"^config.train.wandb_project='?proj'? is invalid; allowed: '' \(off\), or a project where"
    ):
        config.parse(cfg, reads_data=False)
