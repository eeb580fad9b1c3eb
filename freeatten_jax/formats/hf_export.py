"""A run's Llama-shaped model (SwiGLU MLP, RMSNorm, no biases: the ssmax_162m preset, an imported Llama) written in
the Hugging Face Hub's layout, the reverse of hf_llama: config.json as transformers reads a LlamaForCausalLM's
(transformers 4's RoPE keys, rope_theta and rope_scaling, which transformers 5 reads too), a MistralForCausalLM's with
a window (its sliding_window), a Qwen2ForCausalLM's with q/k/v biases; model.safetensors (hf_llama.layout's tensors,
each put back in the Hub's layout by the inverse of its import), generation_config.json and, for a run with a Hugging
Face tokenizer, its tokenizer.json.

Another attention than softmax keeps Llama's tensors; config.json records the variant under ATTENTION_KEY (the
ModelConfig fields that describe it, with SSMax's learned s and b of each layer), a key transformers ignores: it would
run such a model with softmax attention. The special token ids are those of the Hub folder behind the run (training.hub_tokens).
"""

import json
import pathlib

import numpy as np

from freeatten_jax.errors import UserError
from freeatten_jax.formats import hf_llama
from freeatten_jax.nn.config import ModelConfig

ATTENTION_KEY = "freeatten_attention"
GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = {"tokenizer_class": "PreTrainedTokenizerFast"}  # AutoTokenizer's reader of a bare tokenizer.json
SSMAX_PARAMS = {"s_H": "ssmax_s", "b_H": "ssmax_b"}  # SSMax's parameters of each layer -> their key in the record
# What a Llama has not: (ModelConfig -> True when present, what it is); the first that holds is the error.
NOT_LLAMA = (
    (lambda m: m.mlp != "swiglu", lambda m: f"model.mlp={m.mlp!r} (Llama's MLP is swiglu)"),
    (lambda m: m.norm != "rmsnorm", lambda m: f"model.norm={m.norm!r} (Llama's norm is rmsnorm)"),
    (lambda m: m.use_bias, lambda m: "model.use_bias=True (Llama has no biases)"),
    (lambda m: m.qkv_bias and m.window is not None, lambda m: "model.qkv_bias with model.window (Qwen2 has no window)"),
)
# model.qkv_bias / model.window -> (architecture, model_type, config.json keys of that family)
FAMILIES = {
    "llama": ("LlamaForCausalLM", "llama", lambda m: {"attention_bias": False, "mlp_bias": False}),
    "mistral": ("MistralForCausalLM", "mistral", lambda m: {"sliding_window": m.window}),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", lambda m: {"use_sliding_window": False, "sliding_window": None}),
}


class ExportError(UserError, ValueError):
    """A run whose model has no Hugging Face Llama layout, or an output folder that already holds one."""


def check_llama(model: ModelConfig) -> None:
    """An ExportError naming the first thing that makes `model` not Llama-shaped."""
    for present, what in NOT_LLAMA:
        if present(model):
            raise ExportError(
                f"{what(model)}: only Llama-shaped models (swiglu, rmsnorm, no biases but Qwen2's) export to Hugging Face"
            )


def family(model: ModelConfig) -> str:
    """The Hugging Face family of a Llama-shaped model: qwen2 with q/k/v biases, mistral with a window, else llama."""
    return "qwen2" if model.qkv_bias else "mistral" if model.window is not None else "llama"


def to_hub(tensor: hf_llama.Tensor, ours: np.ndarray) -> np.ndarray:
    """Our array in the Hub's layout: the inverse of `tensor.to_ours`, read off from where it moves each element of
    the Hub tensor (it only transposes and reshapes)."""
    index = tensor.to_ours(np.arange(np.prod(tensor.hub_shape)).reshape(tensor.hub_shape))
    hub = np.empty(index.size, ours.dtype)
    hub[index.ravel()] = ours.ravel()
    return hub.reshape(tensor.hub_shape)


def attention_record(model: ModelConfig, params: dict[str, np.ndarray]) -> dict:
    """The attention variant's ModelConfig fields and SSMax's learned parameters ([layer][head]), as config.json keeps
    them under ATTENTION_KEY."""
    record = {"attention": model.attention, "attention_options": dict(model.attention_options)}
    if model.attention == "ssmax":
        record |= {"ssmax_s_init": model.ssmax_s_init, "ssmax_bias": model.ssmax_bias, "ssmax_learn_s": model.ssmax_learn_s}
        for ours, key in SSMAX_PARAMS.items():
            if f"blocks.0.attn.{ours}" in params:
                record[key] = [params[f"blocks.{i}.attn.{ours}"].tolist() for i in range(model.num_layers)]
    return record


def hub_config(
    model: ModelConfig, training_length: int, dtype: np.dtype, params: dict[str, np.ndarray], special: dict | None = None
) -> dict:
    """config.json of `model` as its family's ForCausalLM trained at `training_length` (max_position_embeddings), with
    the `special` token ids ({bos_token_id: ..., ...}; null when not given)."""
    rope_type = next(theirs for theirs, (ours, _) in hf_llama.ROPE_TYPES.items() if ours == model.rope_scaling)
    scaling = {theirs: getattr(model, ours) for theirs, ours in hf_llama.ROPE_TYPES[rope_type][1].items()}
    architecture, model_type, family_keys = FAMILIES[family(model)]
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": model.vocab_size,
        "hidden_size": model.d_model,
        "intermediate_size": model.mlp_dim,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.num_kv_heads or model.num_heads,
        "head_dim": model.d_model // model.num_heads,
        "max_position_embeddings": training_length,
        "rms_norm_eps": hf_llama.DEFAULTS["rms_norm_eps"] if model.norm_eps is None else model.norm_eps,  # RMSNorm's own
        "hidden_act": "silu",
        **family_keys(model),
        "tie_word_embeddings": model.tie_embeddings,
        "rope_theta": model.rope_theta,
        "rope_scaling": {"rope_type": rope_type, **scaling} if scaling else None,
        "bos_token_id": None,
        "eos_token_id": None,
        **(special or {}),
        "torch_dtype": str(dtype),
    }
    if model.attention != "softmax":
        config[ATTENTION_KEY] = attention_record(model, params)
    return config


def export(
    model: ModelConfig,
    training_length: int,
    params: dict[str, np.ndarray],
    tokenizer_json: str | None,
    out,
    special: tuple[dict, dict] = ({}, {}),
) -> list[str]:
    """Writes `params` ({our parameter path: array}) of a Llama-shaped `model` to the folder `out` in the Hub's layout,
    with `special`'s (config.json's special token ids, generation_config.json); the names of the files written.
    Nothing is written if the model is not Llama-shaped or `out` holds a Hub model."""
    from safetensors.numpy import save_file

    check_llama(model)
    out = pathlib.Path(out).expanduser()
    if held := [name for name in hf_llama.MARKERS if (out / name).exists()]:
        raise ExportError(f"{out} already holds {held[0]}: export to a new folder")
    tensors = hf_llama.layout(model)
    ssmax = {f"blocks.{i}.attn.{name}" for i in range(model.num_layers) for name in SSMAX_PARAMS}
    if extra := sorted(set(params) - {t.path for t in tensors.values()} - ssmax):
        raise ExportError(f"parameter {extra[0]} has no place in a Llama")
    # safetensors' numpy writer has no bfloat16: such parameters are written as float32 (exactly)
    widen = lambda w: w.astype(np.float32) if w.dtype.name == "bfloat16" else w
    hub = {name: np.ascontiguousarray(to_hub(t, widen(np.asarray(params[t.path])))) for name, t in tensors.items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(hub, out / hf_llama.SINGLE_FILE, metadata={"format": "pt"})
    dtype = next(iter(hub.values())).dtype
    ids, generation = special
    (out / "config.json").write_text(json.dumps(hub_config(model, training_length, dtype, params, ids), indent=2) + "\n")
    (out / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2) + "\n")
    written = [hf_llama.SINGLE_FILE, "config.json", GENERATION_CONFIG]
    if tokenizer_json is not None:
        (out / "tokenizer.json").write_text(tokenizer_json)
        (out / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")
        written += ["tokenizer.json", "tokenizer_config.json"]
    return written
