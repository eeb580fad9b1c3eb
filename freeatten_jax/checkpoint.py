"""Orbax checkpoints in WORKDIR/checkpoints: train state (params, optimizer, step, RNG streams), the data
iterator's state and the config as JSON; and `load_model` to rebuild a trained model for evaluation."""
import json
import pathlib

import grain
import jax
import ml_collections
import orbax.checkpoint as ocp

from freeatten_jax import optim, train_state

ITEMS = ("state", "data", "config")


class Checkpointer:
    """An async CheckpointManager keeping the last `max_to_keep` steps."""

    def __init__(self, workdir, cfg_checkpoint=None, *, read_only: bool = False):
        keep = cfg_checkpoint.max_to_keep if cfg_checkpoint else None
        async_save = bool(cfg_checkpoint and cfg_checkpoint.async_save)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, read_only=read_only)
        directory = pathlib.Path(workdir).expanduser().absolute() / "checkpoints"
        self.manager = ocp.CheckpointManager(directory, options=options, item_names=ITEMS)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, data_iterator, cfg) -> None:
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=grain.checkpoint.CheckpointSave(data_iterator),
            config=ocp.args.JsonSave(cfg.to_dict()),
        )
        self.manager.save(step, args=args, force=True)

    def restore(self, step: int, abstract_state, data_iterator):
        """The state at `step`; `data_iterator` is moved to where it was at that step."""
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=grain.checkpoint.CheckpointRestore(data_iterator))
        return self.manager.restore(step, args=args)["state"]

    def config(self, step: int) -> ml_collections.ConfigDict:
        restored = self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
        return config_from_dict(restored["config"])

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()


def config_from_dict(d: dict) -> ml_collections.ConfigDict:
    """A saved config back as a ConfigDict (JSON lists become tuples where the config uses tuples)."""
    cfg = ml_collections.ConfigDict(json.loads(json.dumps(d)))
    cfg.mesh.shape = tuple(cfg.mesh.shape)
    cfg.mesh.rules = tuple((name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in cfg.mesh.rules)
    return cfg


def load_model(workdir, step: int | None = None, mesh=None):
    """(model in eval mode, config, step) from a training run's checkpoint (the latest by default).

    The model is rebuilt from the config saved with the checkpoint; `mesh` defaults to one device.
    """
    ckpt = Checkpointer(workdir, read_only=True)
    step = ckpt.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"no checkpoint in {pathlib.Path(workdir) / 'checkpoints'}")
    cfg = ckpt.config(step)
    mesh = mesh or jax.make_mesh((1, 1, 1), ("data", "fsdp", "tensor"), devices=jax.devices()[:1],
                                 axis_types=(jax.sharding.AxisType.Auto,) * 3)
    abstract, _ = train_state.abstract_state(cfg, mesh, optim.make(cfg.optim, cfg.train.steps))
    restored = ckpt.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
    ckpt.close()
    _, eval_def = train_state.graphdefs(cfg)
    return train_state.model_of(eval_def, restored), cfg, step
