"""implementation="auto": the fastest correct path for the platform, variant and size.

Glossary: B batch, T queries, S keys, H heads, K kv heads, D head dim. The rule, per platform:
1. GPU, a softmax-normalised variant (softmax, ssmax), bfloat16/float16 inputs, D <= 256 and a
   multiple of 8, and a mask known to be plain when tracing (`Mask.plain`: T == S, default positions,
   no segments, padding or window): cuDNN flash attention (jax.nn.dot_product_attention) on the
   prepared q, which already carries 1/sqrt(D) and ssmax's s log N_i + b. Deciding while tracing
   (not with a lax.cond) keeps the reference's residuals out of the cuDNN path's memory. If cuDNN
   refuses the shapes when traced (its version, its own limits), the rules below apply.
2. The reference while T·S is at most REFERENCE_MAX_TS for the platform (the faster path there) and one
   float32 score tensor B·H·T·S stays under REFERENCE_MAX_SCORES (4 GiB).
3. Above it, on GPU and TPU, the platform's fused kernels (implementation "pallas": Triton, Mosaic) for every
   variant, as context_parallel_attend's "auto" runs them round the ring; blockwise where they do not apply
   (a dense `mask`, a head dim that is not a power of two from 16) and on the CPU (where the kernels
   would run in interpret mode). On TPU softmax and ssmax also run our Mosaic kernels: JAX's splash attention
   is not compared with them yet (unmeasured).
Where the platforms' choices differ, platforms.platform_dependent decides while tracing, so lowering for another
platform (`lowering_platforms=`, or a compile for a chip from this machine) gets that platform's choice.
"""

import functools
from typing import Literal

import jax
import jax.numpy as jnp

from freeatten_jax.attention import blockwise, pallas, reference
from freeatten_jax.attention.platforms import KINDS, platform_dependent
from freeatten_jax.attention.variants import Mask, Variant

# Largest T·S for which the reference is chosen. CPU: measured (benchmarks/RESULTS.md): in the tiny
# model at T = 256 (benchmarks/model_throughput.py, two runs each) blockwise trained every variant
# faster (1.16x-1.99x), so no variant needs its own limit; the reference stays below (unmeasured there).
# GPU/TPU: not measured here; published autotune data put pure-JAX chunked attention at ~0.5-0.95x
# the materialised XLA path on H100, so the reference is kept up to 2048².
REFERENCE_MAX_TS = {"cpu": 128 * 128, "gpu": 2048 * 2048, "tpu": 2048 * 2048}
REFERENCE_MAX_SCORES = 2**30
_FUSED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def fused_softmax(
    q_BTHD, k_BSKD, v_BSKD, *, variant: Variant, mask: Mask, opts, implementation: Literal["xla", "cudnn"] = "cudnn"
):
    """Softmax/ssmax through jax.nn.dot_product_attention, for a plain mask only (`Mask.plain`).

    N_i is i + 1 (causal) or T (bidirectional). Under a plain mask every key is seen by some query,
    so no key is hidden from its whole batch row (docs/method.md §8 holds as for the other paths)."""
    if not mask.plain:
        raise ValueError(
            "fused_softmax needs a plain mask: q_len == kv_len, default positions, no segments, padding, window or dense mask"
        )
    (b, t), dtype = q_BTHD.shape[:2], q_BTHD.dtype
    n_B1T = jnp.arange(1, t + 1)[None, None] if mask.causal else jnp.full((1, 1, t), t)
    qp_BTHD, kp_BSKD = variant.prepare(q_BTHD, k_BSKD, jnp.broadcast_to(n_B1T, (b, 1, t)), opts)
    qp_BTHD, kp_BSKD, v_BSKD = (x.astype(dtype) for x in (qp_BTHD, kp_BSKD, v_BSKD))
    out_BTHD = jax.nn.dot_product_attention(
        qp_BTHD, kp_BSKD, v_BSKD, scale=1.0, is_causal=mask.causal, implementation=implementation
    )
    return out_BTHD.astype(dtype)


KERNEL_PLATFORMS = ("gpu", "tpu")


def _unfused(q_BTHD, k_BSKD, mask: Mask, platform: str) -> str:
    """Rules 2 and 3: the reference when small, else the platform's kernels where they apply, else blockwise."""
    (b, t, h, d), s = q_BTHD.shape, k_BSKD.shape[1]
    if t * s <= REFERENCE_MAX_TS.get(platform, REFERENCE_MAX_TS["gpu"]) and b * h * t * s <= REFERENCE_MAX_SCORES:
        return "reference"
    kernels = platform in KERNEL_PLATFORMS and mask.dense is None and d >= 16 and d & (d - 1) == 0
    return "pallas" if kernels else "blockwise"


def choose(q_BTHD, k_BSKD, *, variant: Variant, mask: Mask, platform: str | None = None) -> str:
    """The implementation the rule picks on `platform` ("cpu", "gpu", "tpu"): "fused", "reference", "pallas" or
    "blockwise"."""
    platform = platform or jax.default_backend()
    d = q_BTHD.shape[3]
    fusable = variant.normalise == "softmax" and q_BTHD.dtype in _FUSED_DTYPES and mask.plain
    if platform == "gpu" and fusable and d <= 256 and d % 8 == 0:
        return "fused"
    return _unfused(q_BTHD, k_BSKD, mask, platform)


def traces(fn, *args, **kwargs) -> bool:
    """Whether fn traces for these shapes (cuDNN checks its own constraints, e.g. its version, then)."""
    try:
        jax.eval_shape(functools.partial(fn, **kwargs), *args)
    except (ValueError, NotImplementedError, RuntimeError, TypeError):
        return False
    return True


def attend(q_BTHD, k_BSKD, v_BSKD, *, variant: Variant, mask: Mask, opts, **unknown):
    """Attention output [B, T, H, D] through the implementation `choose` picks on the platform it runs on."""
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)}; implementation 'auto' takes none")
    args, kwargs = (q_BTHD, k_BSKD, v_BSKD), dict(variant=variant, mask=mask, opts=opts)
    implementations = {
        "fused": fused_softmax,
        "reference": reference.attend,
        "pallas": pallas.attend,
        "blockwise": blockwise.attend,
    }

    def pick(platform: str) -> str:
        kind = KINDS[platform]
        choice = choose(q_BTHD, k_BSKD, variant=variant, mask=mask, platform=kind)
        if choice == "fused" and not traces(fused_softmax, *args, **kwargs):
            return _unfused(q_BTHD, k_BSKD, mask, kind)
        return choice

    return platform_dependent(pick, lambda choice: functools.partial(implementations[choice], **kwargs), *args)
