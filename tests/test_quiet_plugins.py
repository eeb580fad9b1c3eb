"""quiet_plugins is the console scripts' opt-in: importing the library leaves jax's platform alone, and the CLI's
JAX_PLATFORMS=cpu is set only where no accelerator's device file (TPU, NVIDIA, AMD ROCm) exists."""

import os
import subprocess
import sys

from freeatten_jax import quiet_plugins


def test_importing_the_library_changes_no_platform():
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    code = "import os, freeatten_jax, freeatten_jax.attention, freeatten_jax.nn\nprint(os.environ.get('JAX_PLATFORMS'))"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.split() == ["None"], result.stderr[-2000:]


def test_quiet_platforms_keeps_an_accelerator_and_a_choice():
    for environ, devices, want in [
        ({}, ("/nonexistent*",), "cpu"),
        ({}, ("/",), None),  # an accelerator's device file exists
        ({"JAX_PLATFORMS": "tpu"}, ("/nonexistent*",), "tpu"),
    ]:
        quiet_plugins.quiet_platforms(environ, devices)
        assert environ.get("JAX_PLATFORMS") == want


def test_a_rocm_host_is_an_accelerator_host():
    assert "/dev/kfd" in quiet_plugins.ACCELERATOR_DEVICES
