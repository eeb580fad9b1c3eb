"""Hugging Face Qwen2 import and export. transformers has no Flax Qwen2; Qwen2 is Llama with biases on q, k and v (none
on o or the MLP), so the reference is transformers' `FlaxLlamaForCausalLM` with attention_bias (q/k/v/o biases) given
random q/k/v biases and a zero o bias, written in the Hub's layout as a Qwen2ForCausalLM (tied: lm_head is the
embedding table, as Qwen2-0.5B's). The import gives its logits; the export gives back its tensors and config.json
as transformers' Qwen2Config reads it; Qwen2's sliding window on some layers is refused in one line.
"""

import json
import shutil

import jax
import numpy as np
import pytest
from helpers import HUB, hub_tensors, hub_tokenizer, import_hub
from safetensors.numpy import load_file, save_file
from transformers import FlaxLlamaForCausalLM, LlamaConfig, Qwen2Config

from freeatten_jax.cli import export_hf as export_cli
from freeatten_jax.cli import import_hf as import_cli
from freeatten_jax.training.run_dir import load_run

TEXT = "the king and the queen and the lord of the night"
SIZES = {k: v for k, v in HUB.items() if k not in ("architectures", "tie_word_embeddings")}


def _reference(vocab_size: int, tied: bool) -> FlaxLlamaForCausalLM:
    """A FlaxLlama computing a Qwen2: random q/k/v biases, o's zero; tied: lm_head's kernel the embedding's transpose."""
    reference = FlaxLlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, attention_bias=True, **SIZES), seed=0)
    params = jax.tree_util.tree_map(np.asarray, reference.params)
    rng = np.random.default_rng(0)
    for layer in params["model"]["layers"].values():
        for name in ("q_proj", "k_proj", "v_proj"):
            bias_O = layer["self_attn"][name]["bias"]
            layer["self_attn"][name]["bias"] = rng.normal(0, 0.5, bias_O.shape).astype(np.float32)
        layer["self_attn"]["o_proj"]["bias"] = np.zeros_like(layer["self_attn"]["o_proj"]["bias"])
    if tied:
        params["lm_head"]["kernel"] = np.ascontiguousarray(params["model"]["embed_tokens"]["embedding"].T)
    reference.params = params
    return reference


def _qwen2_tensors(params, tied: bool) -> dict[str, np.ndarray]:
    """The reference's tensors under Qwen2's names: q/k/v `.bias` [out], no o bias, no lm_head when tied."""
    biases = {}
    for i, layer in params["model"]["layers"].items():
        for name in ("q_proj", "k_proj", "v_proj"):
            biases[f"model.layers.{i}.self_attn.{name}.bias"] = np.asarray(layer["self_attn"][name].pop("bias"))
        layer["self_attn"]["o_proj"].pop("bias")
    tensors = {**hub_tensors(params), **biases}
    return {k: v for k, v in tensors.items() if not (tied and k == "lm_head.weight")}


@pytest.fixture(scope="module", params=["untied", "tied"])
def hub(request, text_glob, tmp_path_factory):
    """(the reference, its tokenizer, its Qwen2 Hub folder), untied and tied."""
    tied = request.param == "tied"
    tok = hub_tokenizer(text_glob)
    reference = _reference(tok.get_vocab_size(), tied)
    folder = tmp_path_factory.mktemp("hub") / f"qwen2-{request.param}"
    folder.mkdir()
    config = Qwen2Config(vocab_size=tok.get_vocab_size(), tie_word_embeddings=tied, **SIZES)
    config.architectures = ["Qwen2ForCausalLM"]
    (folder / "config.json").write_text(config.to_json_string())
    (folder / "tokenizer.json").write_text(tok.to_str())
    save_file(_qwen2_tensors(jax.tree_util.tree_map(np.asarray, reference.params), tied), folder / "model.safetensors")
    return reference, tok, folder


def test_an_imported_qwen2_gives_the_references_logits(hub, run_cli, text_glob, tmp_path):
    reference, tok, folder = hub
    import_hub(run_cli, folder, tmp_path / "run", text_glob)
    run = load_run(tmp_path / "run")
    assert (run.config.model.qkv_bias, run.config.model.use_bias, run.config.model.window) == (True, False, None)
    tokens_BT = np.asarray([tok.encode(TEXT).ids] * 2, np.int32)
    tokens_BT[1] = tokens_BT[1][::-1]
    ours_BTV, theirs_BTV = np.asarray(run.model(tokens_BT)), np.asarray(reference(tokens_BT).logits)
    error = float(np.abs(ours_BTV - theirs_BTV).max())
    print(f"max |logit difference| vs FlaxLlamaForCausalLM with Qwen2's biases: {error:.2e}")
    assert error <= 1e-4 and np.abs(theirs_BTV).max() > 1e-2


def test_import_export_gives_back_a_qwen2s_tensors_and_config(hub, run_cli, text_glob, tmp_path):
    _, _, folder = hub
    import_hub(run_cli, folder, tmp_path / "run", text_glob)
    code, lines = run_cli(export_cli.main, str(tmp_path / "run"), str(tmp_path / "out"))
    assert code == 0, lines
    ours, theirs = load_file(tmp_path / "out" / "model.safetensors"), load_file(folder / "model.safetensors")
    assert sorted(ours) == sorted(theirs) and all(np.array_equal(ours[n], theirs[n]) for n in theirs)
    exported, original = Qwen2Config.from_pretrained(tmp_path / "out"), Qwen2Config.from_pretrained(folder)
    fields = (*SIZES, "vocab_size", "tie_word_embeddings", "use_sliding_window", "sliding_window", "layer_types")
    assert exported.architectures == ["Qwen2ForCausalLM"] and exported.model_type == "qwen2"
    assert {k: getattr(exported, k) for k in fields} == {k: getattr(original, k) for k in fields}


def test_qwen2s_sliding_window_on_some_layers_is_one_error_line(hub, run_cli, text_glob, tmp_path):
    shutil.copytree(hub[2], tmp_path / "hub")
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    (tmp_path / "hub" / "config.json").write_text(json.dumps({**config, "use_sliding_window": True}))
    code, lines = run_cli(import_cli.main, str(tmp_path / "hub"), f"--workdir={tmp_path / 'run'}")
    expected = f"error: {tmp_path / 'hub' / 'config.json'}: use_sliding_window=true (Qwen2's sliding window on some layers only)"
    assert (code, lines) == (1, [expected + " is not supported by this import"]) and not (tmp_path / "run").exists()
