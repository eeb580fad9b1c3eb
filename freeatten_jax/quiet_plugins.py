"""The accelerator plugins' start-up noise on a host without the chips, silenced with one line saying what was.

The [compile] extra installs libtpu, which asks the cloud's metadata server for its TPU workers and prints 7 lines
(one an `E0000 ... INVALID_ARGUMENT`), and the CUDA plugin, whose failed start logs a 25-line "Unable to load cuDNN"
traceback: both at jax's first use in any script, or before a deviceless compile.
"""

import functools
import glob
import importlib.util
import logging
import os
import sys

# What libtpu would learn from the metadata server on a TPU host (variables already set win).
_ONE_HOST_WITHOUT_CHIPS = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_ID": "0",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_ACCELERATOR_TYPE": "v5litepod-8",  # any valid name: a deviceless compile's topology is its target's own
}


class _NoPluginErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Jax plugin configuration error")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@functools.cache
def libtpu() -> bool:
    """On a host without TPU chips (no /dev/accel*, no /dev/vfio), tells libtpu what it would ask the metadata server;
    True when that silenced anything (a TPU host keeps libtpu's own discovery)."""
    if not _installed("libtpu") or glob.glob("/dev/accel*") or os.path.isdir("/dev/vfio"):
        return False
    given = {name: value for name, value in _ONE_HOST_WITHOUT_CHIPS.items() if name not in os.environ}
    os.environ.update(given)
    return bool(given)


@functools.cache
def at_import() -> None:
    """Where jax will start every plugin (JAX_PLATFORMS unset) on a host without the chips: libtpu quiet, the CUDA
    plugin's failure dropped from jax's log; one line if either was silenced."""
    if os.environ.get("JAX_PLATFORMS"):
        return
    silenced = ["libtpu's"] if libtpu() else []
    if _installed("jax_plugins.xla_cuda13") and not glob.glob("/dev/nvidia[0-9]*"):
        logging.getLogger("jax._src.xla_bridge").addFilter(_NoPluginErrors())
        silenced.append("the CUDA plugin's")
    if silenced:
        print(f"note: no TPU or GPU on this host: {' and '.join(silenced)} start-up lines silenced", file=sys.stderr)
