"""Orbax checkpoints in WORKDIR/checkpoints (local or cloud): train state (params, optimizer, step, RNG
streams), the data iterator's state and the config as JSON; `load_params` rebuilds a trained model.

A checkpoint that cannot be trusted (unreadable, or the state a non-finite step was computed from) is
moved aside to WORKDIR/quarantine/step_N-<reason>, never deleted.
"""
import json
import re
import uuid

import grain
import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from freeatten_jax.errors import UserError
from freeatten_jax.nn import sharding
from freeatten_jax.training import config, state, storage

ITEMS = ("state", "data", "config")


class CheckpointNotFoundError(UserError, FileNotFoundError):
    """A workdir holds no (readable) checkpoint."""


class CheckpointWriteError(UserError, OSError):
    """The checkpoint folder cannot be written."""


def probe_writable(directory) -> None:
    """Creates and removes a small file in `directory`, so that an unwritable folder fails in seconds, in one line
    (orbax's own failure surfaces only after its barrier times out, minutes later)."""
    probe = directory / f".write_probe-{uuid.uuid4().hex}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise CheckpointWriteError(f"cannot write checkpoints to {directory}: {e.strerror or e}; "
                                   f"make it writable or use another --workdir (the checkpoints in it are untouched)") from None


def describe(error: Exception) -> str:
    """`Type: first line` of an exception (orbax and tensorstore messages run to many lines)."""
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"


class Checkpointer:
    """An async CheckpointManager keeping the last `max_to_keep` steps."""

    def __init__(self, workdir, cfg_checkpoint=None, *, read_only: bool = False):
        keep = cfg_checkpoint.max_to_keep if cfg_checkpoint else None
        async_save = bool(cfg_checkpoint and cfg_checkpoint.async_save)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, read_only=read_only)
        self.workdir = storage.path(workdir)
        self.directory = self.workdir / "checkpoints"
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
        """Records that the step computed from checkpoint `step` had a finite loss and gradient (process 0)."""
        if jax.process_index() == 0:
            (self.workdir / "confirmed.json").write_text(json.dumps({"step": step}) + "\n")

    def confirmed_step(self) -> int | None:
        """The newest checkpoint confirmed good by `confirm`, if any."""
        path = self.workdir / "confirmed.json"
        return json.loads(path.read_text())["step"] if path.exists() else None

    def save(self, step: int, train_state, data_iterator, source: dict) -> None:
        probe_writable(self.directory)
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(train_state),
            data=grain.checkpoint.CheckpointSave(data_iterator),
            config=ocp.args.JsonSave(source),
        )
        self.manager.save(step, args=args, force=True)

    def restore(self, step: int, abstract_state, data_iterator):
        """The state at `step`; `data_iterator` is moved to where it was at that step."""
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=grain.checkpoint.CheckpointRestore(data_iterator))
        return self.manager.restore(step, args=args)["state"]

    def config_json(self, step: int) -> dict:
        """The command line's config saved with `step`, as JSON."""
        return self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]

    def run_config(self, step: int) -> config.Config:
        """The typed config of the run that saved `step`."""
        return config.parse(config.from_json(self.config_json(step)))

    def require_latest(self) -> int:
        """The latest step, or CheckpointNotFoundError."""
        step = self.latest_step()
        if step is None:
            raise CheckpointNotFoundError(f"no checkpoint in {self.directory}; train it first")
        return step

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()


def load_params(workdir, step: int | None = None, mesh=None):
    """(model in eval mode, its typed Config, step) from a run's checkpoint (the latest by default).

    Reads the parameters and model variables only (no optimizer state); `mesh` defaults to one device.
    """
    ckpt = Checkpointer(workdir, read_only=True)
    try:
        step = ckpt.require_latest() if step is None else step
        cfg = ckpt.run_config(step)
        mesh = mesh or sharding.make_mesh((1, 1, 1), jax.devices()[:1])
        target, _ = sharding.abstract(lambda: state.model_state(cfg.model, cfg.train.seed), mesh, cfg.mesh.rules)
        restore = ocp.args.PyTreeRestore(item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True)
        restored = ckpt.manager.restore(step, args=ocp.args.Composite(state=restore))["state"]
    except UserError:
        raise
    except Exception as e:  # missing, truncated or garbage files: orbax, tensorstore and json raise many types
        raise CheckpointNotFoundError(f"checkpoint step {step} in {ckpt.directory} cannot be read ({describe(e)})") from e
    finally:
        ckpt.close()
    _, eval_def = state.graphdefs(cfg.model)
    return state.model_of(eval_def, restored), cfg, step
