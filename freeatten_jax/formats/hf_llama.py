"""Hugging Face Llama-family checkpoints (Llama 2, 3 and 3.1+, SmolLM/SmolLM2, TinyLlama, Mistral, Qwen2) read
without torch: config.json as a `ModelConfig`, model.safetensors (or its shards and their index) as this project's
parameters, tokenizer.json as the run's tokenizer.

Glossary: E hidden_size, H heads, K kv heads, D head dim, F intermediate_size, V vocabulary.
The Hub stores torch Linear weights [out, in]; ours are [in, ...]: q_proj [H*D, E] -> wq_EHD, k/v_proj [K*D, E] ->
wk/wv_EKD, o_proj [E, H*D] -> wo_HDE, gate_proj [F, E] -> w_in_EF (SiLU's input), up_proj [F, E] -> w_gate_EF,
down_proj [E, F] -> w_out_FE, lm_head [V, E] -> unembed_EV. Llama's RoPE rotates the halves of each head
(pairs f, f + D/2) by position * theta^(-2f/D), as nn.rope does, so q and k are copied without a permutation.
Qwen2 adds biases to q/k/v (not o): q_proj.bias [H*D] -> biases.q_HD, k/v_proj.bias [K*D] -> biases.k_KD / v_KD.
Mistral's sliding_window is the model's window: transformers 4.57's Mistral mask (masking_utils'
sliding_window_overlay) shows query i the keys j with i - window < j <= i, as attend's window does.
Weights saved by transformers 4's Flax save_pretrained carry Flax names (a Linear's `kernel` [in, out], the embedding's
`embedding`) and are read as the torch names they stand for.
config.json's RoPE is read as transformers 5 reads it, in either layout: transformers 5 writes `rope_parameters` (a dict
of rope_theta, rope_type and the scaling's fields), transformers 4 `rope_theta` and `rope_scaling` (the fields, with
rope_type or its older name type). The scalings nn.rope implements (ROPE_TYPES) are imported; any other is refused.
"""

import dataclasses
import json
import pathlib
from collections.abc import Callable

import numpy as np

from freeatten_jax.errors import UserError
from freeatten_jax.nn.config import ModelConfig

# config.json's architecture (else its model_type) -> its family
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
}
SINGLE_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
MARKERS = ("config.json", SINGLE_FILE, INDEX_FILE)  # a folder holding any of them is a Hub folder, not a run
IGNORED = (".rotary_emb.inv_freq",)  # buffers some older checkpoints saved: recomputed from the RoPE settings
# Hugging Face defaults (LlamaConfig's) of the keys a config.json may leave out
DEFAULTS = {
    "rms_norm_eps": 1e-6,
    "rope_theta": 10_000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
}
FAMILY_DEFAULTS = {  # MistralConfig's and Qwen2Config's defaults where they differ from LlamaConfig's
    "llama": {},
    "mistral": {"max_position_embeddings": 4096 * 32, "sliding_window": 4096},
    "qwen2": {"max_position_embeddings": 32768},
}
FAMILY_NAMES = {"llama": "Llama without biases", "mistral": "Mistral without biases", "qwen2": "Qwen2 (biases in q/k/v only)"}
# Hugging Face's rope_type -> (model.rope_scaling, {each field it needs: the ModelConfig field that takes it})
ROPE_TYPES = {
    "default": ("none", {}),
    "linear": ("linear", {"factor": "rope_factor"}),
    "llama3": (
        "llama3",
        {
            "factor": "rope_factor",
            "low_freq_factor": "rope_low_freq_factor",
            "high_freq_factor": "rope_high_freq_factor",
            "original_max_position_embeddings": "rope_original_len",
        },
    ),
}
# What this import does not implement: (config.json -> True when present, what it is); the first that holds is the error.
UNSUPPORTED = (
    (
        lambda c: c["rope_parameters"]["rope_type"] not in ROPE_TYPES,
        lambda c: f"rope_type {c['rope_parameters']['rope_type']!r} (RoPE scaling other than {', '.join(ROPE_TYPES)})",
    ),
    (
        lambda c: c["rope_parameters"].get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)) != 1.0,
        lambda c: "partial_rotary_factor other than 1 (RoPE on part of each head)",
    ),
    (
        lambda c: c["family"] == "qwen2" and (c.get("use_sliding_window") or "sliding_attention" in (c.get("layer_types") or ())),
        lambda c: "use_sliding_window=true (Qwen2's sliding window on some layers only)",
    ),
    (lambda c: bool(c.get("attention_bias")), lambda c: "attention_bias=true (biases in q/k/v/o)"),
    (lambda c: bool(c.get("mlp_bias")), lambda c: "mlp_bias=true (biases in the MLP)"),
    (lambda c: c["hidden_act"] != "silu", lambda c: f"hidden_act={c['hidden_act']!r} (only SiLU-gated MLPs)"),
    (
        lambda c: c["head_dim"] * c["num_attention_heads"] != c["hidden_size"],
        lambda c: f"head_dim={c.get('head_dim')} (not hidden_size / num_attention_heads)",
    ),
)
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


class HubError(UserError, ValueError):
    """A Hugging Face folder that cannot be imported: a missing file, an unsupported architecture or a bad tensor."""


@dataclasses.dataclass(frozen=True)
class Tensor:
    """Where one Hub tensor goes: our parameter's path, the Hub shape config.json implies, and the layout change."""

    path: str
    hub_shape: tuple[int, ...]
    to_ours: Callable[[np.ndarray], np.ndarray]


def rope_parameters(hub: dict) -> dict:
    """config.json's RoPE as transformers 5 reads it, from either layout: `rope_scaling` (4) if set, else
    `rope_parameters` (5), with rope_theta (else the top-level one), rope_type (else its older name type, else default)
    and llama3's original_max_position_embeddings (else max_position_embeddings) filled in."""
    rope = dict(hub.get("rope_scaling") or hub.get("rope_parameters") or {})
    rope.setdefault("rope_theta", hub["rope_theta"])
    rope.setdefault("rope_type", rope.get("type", "default"))
    if rope["rope_type"] == "llama3":
        rope.setdefault("original_max_position_embeddings", hub["max_position_embeddings"])
    return rope


def read_config(folder) -> dict:
    """config.json with its family's defaults filled in (its `family` added, head_dim null read as absent) and its RoPE
    as `rope_parameters` (in transformers 5's layout, whichever it was written in); an unsupported architecture or
    feature is a HubError."""
    path = pathlib.Path(folder).expanduser() / "config.json"
    if not path.is_file():
        raise HubError(f"{path} not found: a Hugging Face model folder has config.json and model.safetensors")
    written = json.loads(path.read_text())
    architectures = written.get("architectures") or [written.get("model_type", "none")]
    if architectures[0] not in ARCHITECTURES:
        raise HubError(f"{path}: architecture {architectures[0]!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
    family = ARCHITECTURES[architectures[0]]
    hub = {**DEFAULTS, **FAMILY_DEFAULTS[family], **written, "family": family}
    hub["rope_parameters"] = rope_parameters(hub)
    if missing := [key for key in REQUIRED if key not in hub]:
        raise HubError(f"{path} lacks {missing[0]!r}")
    hub["head_dim"] = hub.get("head_dim") or hub["hidden_size"] // hub["num_attention_heads"]  # transformers' reading
    for unsupported, what in UNSUPPORTED:
        if unsupported(hub):
            raise HubError(f"{path}: {what(hub)} is not supported by this import")
    rope = hub["rope_parameters"]
    if missing := [name for name in ROPE_TYPES[rope["rope_type"]][1] if name not in rope]:
        raise HubError(f"{path}: RoPE scaling {rope['rope_type']!r} lacks {missing[0]!r}")
    return hub


def rope_fields(rope: dict) -> dict:
    """The ModelConfig's rope_* fields of a `rope_parameters` dict (as `rope_parameters` returns it)."""
    kind, fields = ROPE_TYPES[rope["rope_type"]]
    return {
        "rope_theta": float(rope["rope_theta"]),
        "rope_scaling": kind,
        **{ours: rope[theirs] for theirs, ours in fields.items()},
    }


def model_config(hub: dict, max_len: int) -> ModelConfig:
    """The ModelConfig of a Llama, Mistral or Qwen2 config.json (softmax attention, float32, trained at `max_len`):
    Qwen2's q/k/v biases, Mistral's sliding window (Llama's and Qwen2's sliding_window keys go unread, as in
    transformers)."""
    return ModelConfig(
        vocab_size=hub["vocab_size"],
        num_layers=hub["num_hidden_layers"],
        num_heads=hub["num_attention_heads"],
        d_model=hub["hidden_size"],
        mlp_dim=hub["intermediate_size"],
        num_kv_heads=hub.get("num_key_value_heads") or 0,
        max_len=max_len,
        mlp="swiglu",
        norm="rmsnorm",
        norm_eps=float(hub["rms_norm_eps"]),
        tie_embeddings=bool(hub["tie_word_embeddings"]),
        qkv_bias=hub["family"] == "qwen2",
        window=hub.get("sliding_window") if hub["family"] == "mistral" else None,
        **rope_fields(hub["rope_parameters"]),
    )


def layout(cfg: ModelConfig) -> dict[str, Tensor]:
    """Every Hub tensor name of a model of `cfg` -> where it goes (lm_head only when untied, q/k/v biases with
    qkv_bias)."""
    e, f, v, h = cfg.d_model, cfg.mlp_dim, cfg.vocab_size, cfg.num_heads
    k, d = cfg.num_kv_heads or h, cfg.d_model // h
    transpose = lambda w_OI: w_OI.T
    per_layer = {
        "self_attn.q_proj.weight": ("attn.wq_EHD", (h * d, e), lambda w_OE: w_OE.T.reshape(e, h, d)),
        "self_attn.k_proj.weight": ("attn.wk_EKD", (k * d, e), lambda w_OE: w_OE.T.reshape(e, k, d)),
        "self_attn.v_proj.weight": ("attn.wv_EKD", (k * d, e), lambda w_OE: w_OE.T.reshape(e, k, d)),
        "self_attn.o_proj.weight": ("attn.wo_HDE", (e, h * d), lambda w_EO: w_EO.T.reshape(h, d, e)),
        "mlp.gate_proj.weight": ("mlp.w_in_EF", (f, e), transpose),
        "mlp.up_proj.weight": ("mlp.w_gate_EF", (f, e), transpose),
        "mlp.down_proj.weight": ("mlp.w_out_FE", (e, f), transpose),
        "input_layernorm.weight": ("attn_norm.scale_E", (e,), np.asarray),
        "post_attention_layernorm.weight": ("mlp_norm.scale_E", (e,), np.asarray),
    }
    if cfg.qkv_bias:
        per_layer["self_attn.q_proj.bias"] = ("attn.biases.q_HD", (h * d,), lambda b_O: b_O.reshape(h, d))
        per_layer["self_attn.k_proj.bias"] = ("attn.biases.k_KD", (k * d,), lambda b_O: b_O.reshape(k, d))
        per_layer["self_attn.v_proj.bias"] = ("attn.biases.v_KD", (k * d,), lambda b_O: b_O.reshape(k, d))
    tensors = {
        f"model.layers.{i}.{name}": Tensor(f"blocks.{i}.{ours}", shape, convert)
        for i in range(cfg.num_layers)
        for name, (ours, shape, convert) in per_layer.items()
    }
    tensors["model.embed_tokens.weight"] = Tensor("embed_VE", (v, e), np.asarray)
    tensors["model.norm.weight"] = Tensor("final_norm.scale_E", (e,), np.asarray)
    if not cfg.tie_embeddings:
        tensors["lm_head.weight"] = Tensor("unembed_EV", (v, e), transpose)
    return tensors


def flax_named(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """The layout under the names transformers 4's Flax save_pretrained writes: a Linear's `kernel` [in, out] (its
    torch weight transposed), the embedding table's `embedding`; norms and biases keep theirs."""
    renamed = {}
    for name, tensor in tensors.items():
        stem = name.removesuffix(".weight")
        if name.endswith("embed_tokens.weight"):
            renamed[f"{stem}.embedding"] = tensor
        elif name.endswith(".weight") and len(tensor.hub_shape) == 2:
            renamed[f"{stem}.kernel"] = Tensor(tensor.path, tensor.hub_shape[::-1], lambda w_IO, t=tensor: t.to_ours(w_IO.T))
        else:
            renamed[name] = tensor
    return renamed


def _files(folder: pathlib.Path) -> dict[str, pathlib.Path]:
    """Each stored tensor name -> its safetensors file (model.safetensors, or the shards its index names)."""
    if (folder / INDEX_FILE).is_file():
        weight_map = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
        files = {name: folder / file for name, file in weight_map.items()}
    elif (folder / SINGLE_FILE).is_file():
        from safetensors import safe_open

        with safe_open(folder / SINGLE_FILE, framework="numpy") as f:
            files = dict.fromkeys(f.keys(), folder / SINGLE_FILE)
    else:
        raise HubError(f"{folder} has neither {SINGLE_FILE} nor {INDEX_FILE}")
    if missing := sorted({str(p) for p in files.values() if not p.is_file()}):
        raise HubError(f"{missing[0]} not found ({INDEX_FILE} names it)")
    return files


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A checked Hub folder: its config.json, the ModelConfig and its tensors' files; `load` reads the parameters."""

    folder: pathlib.Path
    hub: dict
    model: ModelConfig
    tensors: dict[str, Tensor]
    files: dict[str, pathlib.Path]

    @property
    def training_length(self) -> int:
        """The length the model was trained for: max_position_embeddings (2048 when config.json gives none)."""
        return int(self.hub["max_position_embeddings"])

    def load(self) -> dict[str, np.ndarray]:
        """Our parameter path -> array in our layout, in the stored dtype."""
        from safetensors import safe_open

        params = {}
        for path in sorted(set(self.files.values())):
            with safe_open(path, framework="numpy") as f:
                for name in f.keys():
                    if name in self.tensors:
                        params[self.tensors[name].path] = self.tensors[name].to_ours(f.get_tensor(name))
        return params


def open_checkpoint(folder, max_len: int | None = None) -> Checkpoint:
    """A Hub folder, checked without reading its weights: the config is supported, every tensor is there with the shape
    the config implies, and no tensor is left over (biases a Llama has none of), under torch's names or Flax's.
    `max_len`: the model's training length (default max_position_embeddings)."""
    folder = pathlib.Path(folder).expanduser()
    hub = read_config(folder)
    model = model_config(hub, max_len or int(hub["max_position_embeddings"]))
    tensors, files = layout(model), _files(folder)
    if any(name.endswith((".kernel", ".embedding")) for name in files):
        tensors = flax_named(tensors)
    tied_head = ("lm_head.weight", "lm_head.kernel") if model.tie_embeddings else ()
    if extra := sorted(n for n in files if n not in tensors and not n.endswith(IGNORED) and n not in tied_head):
        family = FAMILY_NAMES[hub["family"]]
        raise HubError(f"{folder}: tensor {extra[0]!r} has no place in a {model.num_layers}-layer {family}")
    if missing := [n for n in tensors if n not in files]:
        raise HubError(f"{folder}: tensor {missing[0]!r} is missing ({len(missing)} of {len(tensors)} are)")
    from safetensors import safe_open

    for path in sorted(set(files.values())):
        with safe_open(path, framework="numpy") as f:
            for name in f.keys():
                shape = tuple(f.get_slice(name).get_shape())
                if name in tensors and shape != tensors[name].hub_shape:
                    raise HubError(f"{path}: {name} has shape {shape} but config.json implies {tensors[name].hub_shape}")
    return Checkpoint(folder, hub, model, tensors, files)


def tokenizer(folder):
    """The folder's tokenizer.json as the run's tokenizer (a HubError if there is none)."""
    from freeatten_jax.data.tokenizer import FileTokenizer

    path = pathlib.Path(folder).expanduser() / "tokenizer.json"
    if not path.is_file():
        raise HubError(f"{path} not found: the model's tokenizer is needed in the `tokenizers` JSON format")
    return FileTokenizer(path)
