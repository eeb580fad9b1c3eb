"""Model FLOPs per token and the devices' peak, for TFLOP/s and MFU (model FLOPs utilisation).

Training FLOPs per token, as in PaLM (appendix B): 6 N for the N matrix parameters (embedding lookups
excluded, the unembedding included) plus 6 L T E for the attention scores and weighted sum of a
T-token causal window (the causal half is counted, as in Megatron's and MaxText's reports).
"""

import math

from freeatten_jax.nn.config import ModelConfig

# Dense bf16 peak TFLOP/s per device, as published by the vendors, keyed by jax's device_kind.
PEAK_TFLOPS = {
    "NVIDIA H100 80GB HBM3": 989.0,
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H200": 989.0,
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-SXM4-40GB": 312.0,
    "TPU v4": 275.0,
    "TPU v5 lite": 197.0,
    "TPU v5": 459.0,
    "TPU v6 lite": 918.0,
}


def matrix_params(cfg: ModelConfig) -> int:
    """Parameters that take part in matrix multiplies per token (projections, MLP, unembedding)."""
    head_dim, kv_heads = cfg.d_model // cfg.num_heads, cfg.num_kv_heads or cfg.num_heads
    attn = cfg.d_model * head_dim * (2 * cfg.num_heads + 2 * kv_heads)
    mlp = cfg.d_model * cfg.mlp_dim * (3 if cfg.mlp == "swiglu" else 2)
    return cfg.num_layers * (attn + mlp) + cfg.d_model * cfg.vocab_size


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Forward plus backward model FLOPs per trained token (rematerialisation not counted)."""
    return 6.0 * matrix_params(cfg) + 6.0 * cfg.num_layers * seq_len * cfg.d_model


def peak_tflops(device_kind: str, configured: float = 0.0) -> float | None:
    """The configured peak if > 0, else the known one for the device, else None (MFU unknown)."""
    return configured if configured > 0 else PEAK_TFLOPS.get(device_kind)


def tflops_and_mfu(tokens_per_sec: float, flops_per_token: float, num_devices: int, peak: float | None) -> dict:
    """{"tflops_per_device": ..., "mfu": ...} (mfu only when the peak is known)."""
    tflops = tokens_per_sec * flops_per_token / num_devices / 1e12
    row = {"tflops_per_device": tflops}
    if peak is not None and math.isfinite(tflops):
        row["mfu"] = tflops / peak
    return row
