"""Console-script entry points. Each loads its command lazily, so that a core install (`pip install .`)
without the extra a command needs says which extra to install in one line instead of a traceback, and after
quiet_plugins has kept the accelerator plugins quiet on a host without chips."""

import importlib
import sys

from freeatten_jax import quiet_plugins


def _run(module: str, extra: str) -> None:
    quiet_plugins.quiet_platforms()
    try:
        command = importlib.import_module(module)
    except ModuleNotFoundError as e:
        sys.exit(f"error: {e.name} is not installed; this command needs pip install 'freeatten_jax[{extra}]'")
    command.main()


def train() -> None:
    from freeatten_jax.training import signals

    with signals.stopping():  # first: a signal during the command's imports (seconds) is a preemption too, exit 75
        _run("freeatten_jax.cli.train", "train")


def evaluate() -> None:
    _run("freeatten_jax.cli.evaluate", "train,eval")


def generate() -> None:
    _run("freeatten_jax.cli.generate", "train")


def import_() -> None:
    _run("freeatten_jax.cli.import_hf", "train")


def export() -> None:
    _run("freeatten_jax.cli.export_hf", "train")


def harness() -> None:
    _run("freeatten_jax.cli.harness", "harness")


def compile_() -> None:
    _run("freeatten_jax.cli.compile", "compile")
