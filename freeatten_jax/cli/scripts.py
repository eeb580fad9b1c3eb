"""Console-script entry points. Each loads its command lazily, so that a core install (`pip install .`)
without the extra a command needs says which extra to install in one line instead of a traceback."""

import glob
import importlib
import os
import sys

# Device files of a TPU VM (accel, vfio) or an NVIDIA machine. Without any, jax's TPU and CUDA plugins (the [compile]
# extra installs both) can only print why they cannot start, libtpu's host-bounds lines and a cuDNN error, before
# the command's own first line: then the commands run with JAX_PLATFORMS=cpu (freeatten-compile still reaches both
# compilers through their topologies). A JAX_PLATFORMS already set is kept.
ACCELERATOR_DEVICES = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*")


def quiet_platforms(environ=os.environ, devices=ACCELERATOR_DEVICES) -> None:
    """JAX_PLATFORMS=cpu where no accelerator's device file exists and none is set."""
    if "JAX_PLATFORMS" not in environ and not any(glob.glob(pattern) for pattern in devices):
        environ["JAX_PLATFORMS"] = "cpu"


def _run(module: str, extra: str) -> None:
    quiet_platforms()
    try:
        command = importlib.import_module(module)
    except ModuleNotFoundError as e:
        sys.exit(f"error: {e.name} is not installed; this command needs pip install 'freeatten_jax[{extra}]'")
    command.main()


def train() -> None:
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
