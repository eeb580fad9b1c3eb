"""Named chips to compile for without them: TPU topologies from libtpu, NVIDIA GPUs through the CUDA PJRT plugin.

A target gives the devices of a `jax.experimental.topologies` description (deviceless: nothing runs) and
each device's HBM. TPU names follow Cloud TPU (`v5p-8`: 4 chips, 8 TensorCores; `tpu:<topology>` takes a
libtpu topology such as `v5e:4x4`; `2xv5p-32` is two slices joined over DCN); GPU targets carry an XLA
GpuTargetConfig written from the chips' public specifications (compute capability 9.0a, 132 SMs, 227 KiB shared memory per block).
"""

import functools
import glob
import os
import re
import shutil
import sys
from typing import NamedTuple

from freeatten_jax import quiet_plugins

GIB = 2**30


class Target(NamedTuple):
    platform: str  # "tpu" | "cuda"
    topology: str  # libtpu topology name, or "1x1xN" GPUs
    chip_config: str  # libtpu chip_config_name ("" for GPUs)
    hbm_bytes: int  # per device
    device: str  # what the chip is (for GPUs: the device kind the config names)
    slices: int = 1  # TPU slices joined over DCN (`2xv5p-32`)


def _gpu_config(name: str, memory_bytes: int) -> str:
    """An XLA GpuTargetConfig (text proto) of an SXM Hopper GPU."""
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152 shared_memory_per_core: 233472
  threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128 block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535 block_dim_limit_z: 65535 memory_bandwidth: 3352320000000 l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: {memory_bytes} shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 feature_extension: ACCELERATED_FEATURES }}
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 10 }}
device_description_str: "{name}"
"""


H100_BYTES, H200_BYTES = 84942979072, 150754820096
TARGETS = {
    "v5e-8": Target("tpu", "v5e:2x4", "default", 16 * GIB, "TPU v5e"),
    "v5p-8": Target("tpu", "v5:2x2x1", "megacore", 95 * GIB, "TPU v5p"),
    "v5p-32": Target("tpu", "v5:2x2x4", "megacore", 95 * GIB, "TPU v5p"),
    "v5e-16": Target("tpu", "v5e:4x4", "default", 16 * GIB, "TPU v5e"),
    "v6e-8": Target("tpu", "v6e:2x4", "default", 32 * GIB, "TPU v6e"),
    "v4-8": Target("tpu", "v4:2x2x1", "megacore", 32 * GIB, "TPU v4"),
    "h100": Target("cuda", "1x1x1", "", H100_BYTES, "NVIDIA H100 80GB HBM3"),
    "h200": Target("cuda", "1x1x1", "", H200_BYTES, "NVIDIA H200"),
    "8xh100": Target("cuda", "1x1x8", "", H100_BYTES, "NVIDIA H100 80GB HBM3"),
}
TPU_HBM = {"v4": 32 * GIB, "v5e": 16 * GIB, "v5": 95 * GIB, "v6e": 32 * GIB}  # tpu:<topology> targets


def parse(name: str) -> Target:
    """The Target of a name in TARGETS or `tpu:<libtpu topology>` (ValueError naming the valid ones)."""
    if name in TARGETS:
        return TARGETS[name]
    if (several := re.fullmatch(r"(\d+)x(.+)", name)) and int(several[1]) > 1 and parse(several[2]).platform == "tpu":
        return parse(several[2])._replace(slices=int(several[1]))
    if name.startswith("tpu:") and ":" in name[4:]:
        generation = name[4:].split(":")[0]
        if generation in TPU_HBM:
            chip_config = "megacore" if generation in ("v4", "v5") else "default"
            return Target("tpu", name[4:], chip_config, TPU_HBM[generation], f"TPU {generation}")
    raise ValueError(
        f"unknown target {name!r}; valid: {', '.join(TARGETS)}, or tpu:<generation>:<topology> "
        f"with generation one of {', '.join(TPU_HBM)} (e.g. tpu:v5e:4x4), either as N slices: Nx<tpu target> (e.g. 2xv5p-32)"
    )


def _with_ptxas() -> None:
    """XLA compiles PTX with ptxas: put the nvidia-cuda-nvcc wheel's on PATH when the host has none."""
    if shutil.which("ptxas"):
        return
    try:
        import nvidia
    except ImportError:
        return
    for root in nvidia.__path__:
        for path in glob.glob(os.path.join(root, "*", "bin", "ptxas")):
            os.environ["PATH"] = os.path.dirname(path) + os.pathsep + os.environ["PATH"]
            return


_NO_TPU_NOTE = "note: no TPU on this host: libtpu told it is one host of its own (its start-up lines silenced)"


@functools.cache
def devices(name: str):
    """The target's devices (deviceless: they compile, never run)."""
    from jax.experimental import topologies

    target = parse(name)
    if target.platform == "tpu":
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # libtpu locks its temp dir against a second process
        if quiet_plugins.libtpu():
            print(_NO_TPU_NOTE, file=sys.stderr)
        kwargs = dict(chip_config_name=target.chip_config, num_slices=target.slices)
        if target.topology.count("1") == len(target.topology.split(":")[1].split("x")):
            kwargs["chips_per_host_bounds"] = (1, 1, 1)  # a one-chip topology
        return topologies.get_topology_desc(topology_name=target.topology, platform="tpu", **kwargs).devices
    _with_ptxas()
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")  # the plugin need not find CUDA libraries to compile
    config = _gpu_config(target.device, target.hbm_bytes)
    return topologies.get_topology_desc(platform="cuda", topology_name="", topology=target.topology, target_config=config).devices
