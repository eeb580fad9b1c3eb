"""Model sizes (SPEC §5) and the default mesh, as ml_collections ConfigDicts.

tiny: trains on a CPU in minutes (byte vocabulary). gpt2_small: the LSSA paper's GPT-2 small with
RoPE instead of learned positions (~124M, tied). ssmax_162m: the SSMax paper's model (~162M:
gated FFN 2048, untied, vocab 50,257). Field meanings and allowed values: freeatten_jax.model.
"""
import ml_collections

_COMMON = dict(
    attention="softmax",  # variant name: softmax | ssmax | lssa | lssar | sigmoid | relu
    attention_options={},  # the variant's own options, e.g. {"p": 15.0} for lssar (p None = LSSA)
    implementation="auto",  # how attention is computed: auto | reference | blockwise (freeatten_jax.attention.auto)
    num_kv_heads=0,  # 0: as many as num_heads
    norm="layernorm",  # layernorm | rmsnorm
    mlp="gelu",  # gelu | swiglu (gated)
    tie_embeddings=True,
    use_bias=False,
    dropout=0.0,
    remat="none",  # none | dots | full
    dtype="float32",  # compute dtype: float32 | bfloat16
    param_dtype="float32",
    rope_theta=10_000.0,
    ssmax_s_init=-1.0,  # initial SSMax s; -1: 1 / log(max_len), so s log N_i = 1 at the training length
    ssmax_bias=False,  # learnable per-head b in (s log N_i + b)
)

_SIZES = {
    "tiny": dict(vocab_size=256, num_layers=4, num_heads=4, d_model=128, mlp_dim=512, max_len=256),
    "gpt2_small": dict(
        vocab_size=50257, num_layers=12, num_heads=12, d_model=768, mlp_dim=3072, max_len=1024,
        use_bias=True, dtype="bfloat16",
    ),
    "ssmax_162m": dict(
        vocab_size=50257, num_layers=12, num_heads=12, d_model=768, mlp_dim=2048, max_len=1024,
        mlp="swiglu", norm="rmsnorm", tie_embeddings=False, attention="ssmax", dtype="bfloat16",
    ),
}


def model_config(size: str = "tiny") -> ml_collections.ConfigDict:
    """The model preset `size` (one of tiny, gpt2_small, ssmax_162m)."""
    if size not in _SIZES:
        raise ValueError(f"unknown model size {size!r}; valid sizes: {', '.join(_SIZES)}")
    return ml_collections.ConfigDict({**_COMMON, **_SIZES[size]})


def mesh_config() -> ml_collections.ConfigDict:
    """Mesh ('data', 'fsdp', 'tensor') of shape (-1, 1, 1) (pure data parallel) and the logical rules."""
    cfg = ml_collections.ConfigDict()
    cfg.shape = (-1, 1, 1)  # e.g. (1, -1, 1) for FSDP, (2, 2, 2) mixed; -1 fills the remaining devices
    cfg.rules = (
        ("batch", ("data", "fsdp")),  # inputs [B, T]
        ("length", None),
        ("act_batch", ("data", "fsdp")),  # activations at block boundaries [B, T, E]
        ("act_length", None),
        ("act_embed", None),
        ("act_vocab", "tensor"),
        ("vocab", "tensor"),  # parameters
        ("embed", "fsdp"),
        ("heads", "tensor"),
        ("kv_heads", "tensor"),
        ("head_dim", None),
        ("mlp", "tensor"),
    )
    return cfg
