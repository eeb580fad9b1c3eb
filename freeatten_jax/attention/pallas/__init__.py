"""The fused kernel path (implementation="pallas"): api.py runs it on a device, ring.py round the context ring.

Rooms: common.py (what the backends' kernels share: KernelRefs, Static, BlockSizes), gpu.py (Triton), mosaic_gpu.py
(a Mosaic GPU forward for LSSA on Hopper, with gpu.py's backward), tpu.py (Mosaic TPU) and its tpu_schedule.py,
plan.py (the spans of block pairs to visit), core.py (the lowering table, the kernels' arguments and the custom VJP).
gpu.py, mosaic_gpu.py and tpu.py import nothing from each other.
"""

from freeatten_jax.attention.pallas.api import attend

__all__ = ["attend"]
