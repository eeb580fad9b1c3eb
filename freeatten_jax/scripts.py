"""Console-script entry points. Each loads its command lazily, so that a core install (`pip install .`)
without the extra a command needs says which extra to install in one line instead of a traceback."""

import importlib
import sys


def _run(module: str, extra: str) -> None:
    try:
        command = importlib.import_module(module)
    except ModuleNotFoundError as e:
        sys.exit(f"error: {e.name} is not installed; this command needs pip install 'freeatten_jax[{extra}]'")
    command.main()


def train() -> None:
    _run("freeatten_jax.training.cli", "train")


def evaluate() -> None:
    _run("freeatten_jax.evaluation.cli", "train,eval")


def generate() -> None:
    _run("freeatten_jax.training.generate_cli", "train")


def import_() -> None:
    _run("freeatten_jax.training.import_cli", "train")


def compile_() -> None:
    _run("freeatten_jax.compile.cli", "compile")
