"""The accelerator plugins kept quiet on a host without the chips, for the console scripts (opt-in).

The [compile] extra installs libtpu and the CUDA plugin. Where no accelerator's device file exists, both can only
print why they cannot start (libtpu's host-bounds lines and an `E0000 ... INVALID_ARGUMENT`, a 25-line "Unable to load
cuDNN" traceback) at jax's first use. Every console script calls `quiet_platforms()` before it imports jax: it sets
JAX_PLATFORMS=cpu there (a value already set is kept); a deviceless compile still reaches both compilers through their
topologies, libtpu told what it would ask the cloud's metadata server. Importing the library changes nothing: a
user's script opts in with `from freeatten_jax import quiet_plugins; quiet_plugins.quiet_platforms()`.
"""

import functools
import glob
import importlib.util
import os
import sys

# a TPU VM's (accel, vfio), NVIDIA's, AMD ROCm's kernel driver: where one exists, the platform is left to jax
ACCELERATOR_DEVICES = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*", "/dev/kfd")

# What libtpu would learn from the metadata server on a TPU host (variables already set win).
_ONE_HOST_WITHOUT_CHIPS = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_ID": "0",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_ACCELERATOR_TYPE": "v5litepod-8",  # any valid name: a deviceless compile's topology is its target's own
}


def quiet_platforms(environ=os.environ, devices=ACCELERATOR_DEVICES) -> None:
    """JAX_PLATFORMS=cpu where no accelerator's device file exists and none is set (and in jax's config, which read the
    variable when jax was imported: a script may import jax first)."""
    if "JAX_PLATFORMS" not in environ and not any(glob.glob(pattern) for pattern in devices):
        environ["JAX_PLATFORMS"] = "cpu"
        if environ is os.environ and "jax" in sys.modules:
            sys.modules["jax"].config.update("jax_platforms", "cpu")


@functools.cache
def libtpu() -> bool:
    """On a host without TPU chips, tells libtpu what it would ask the metadata server before a deviceless compile;
    True when that silenced anything (a TPU host keeps libtpu's own discovery)."""
    if importlib.util.find_spec("libtpu") is None or any(glob.glob(pattern) for pattern in ACCELERATOR_DEVICES[:2]):
        return False
    given = {name: value for name, value in _ONE_HOST_WITHOUT_CHIPS.items() if name not in os.environ}
    os.environ.update(given)
    return bool(given)
