"""Hugging Face Mistral import: a tiny random `FlaxMistralForCausalLM` (transformers, test-only) with a sliding window
shorter than the test sequence, in the Hub's layout with transformers 4.57's config.json (`"head_dim": null`), imported
with freeatten-import, gives the same logits and greedy tokens (its KV cache windowed too). The window is transformers'
PyTorch Mistral's (masking_utils: query i sees keys j > i - window, `window` keys); FlaxMistral's mask keeps one more
(`jnp.triu(causal, -window)`: j >= i - window), so the reference is FlaxMistral at sliding_window - 1, and its mask
at the window itself (one key wider) gives other logits. The export gives back its tensors and window.
"""

import importlib.util
import json
import pathlib

import numpy as np
import pytest
from helpers import HUB, hub_tokenizer, import_hub, write_hub_folder
from safetensors.numpy import load_file
from transformers import FlaxMistralForCausalLM, MistralConfig

from freeatten_jax.cli import export_hf as export_cli
from freeatten_jax.nn import generate
from freeatten_jax.training.run_dir import load_run

WINDOW = 5
TEXT = "the king and the queen and the lord of the night"


def _reference(vocab_size: int, sliding_window: int | None) -> FlaxMistralForCausalLM:
    return FlaxMistralForCausalLM(MistralConfig(vocab_size=vocab_size, sliding_window=sliding_window, **HUB), seed=0)


@pytest.fixture(scope="module")
def hub(text_glob, tmp_path_factory):
    """(the reference: FlaxMistral at WINDOW - 1, its tokenizer, its Hub folder with sliding_window=WINDOW)."""
    tok = hub_tokenizer(text_glob)
    reference = _reference(tok.get_vocab_size(), WINDOW - 1)
    folder = write_hub_folder(tmp_path_factory.mktemp("hub") / "mistral", reference, tok)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["MistralForCausalLM"], "sliding_window": WINDOW}))
    return reference, tok, folder


def test_transformers_pytorch_mistral_window_is_window_keys():
    """The definition the import follows, as transformers 4's PyTorch mask states it (torch itself is not installed)."""
    masking = pathlib.Path(importlib.util.find_spec("transformers").origin).parent / "masking_utils.py"
    assert "return kv_idx > q_idx - sliding_window" in masking.read_text()


def test_config_json_as_transformers_writes_it_has_head_dim_null(hub):
    assert json.loads((hub[2] / "config.json").read_text())["head_dim"] is None


def test_an_imported_mistral_gives_the_references_windowed_logits_and_greedy_tokens(hub, run_cli, text_glob, tmp_path):
    reference, tok, folder = hub
    import_hub(run_cli, folder, tmp_path / "run", text_glob)
    run = load_run(tmp_path / "run")
    assert run.config.model.window == WINDOW
    tokens_BT = np.asarray([tok.encode(TEXT).ids] * 2, np.int32)
    tokens_BT[1] = tokens_BT[1][::-1]
    assert tokens_BT.shape[1] > 2 * WINDOW
    ours_BTV = np.asarray(run.model(tokens_BT))
    theirs_BTV = np.asarray(reference(tokens_BT).logits)
    wider_BTV = np.asarray(_reference(tok.get_vocab_size(), WINDOW)(tokens_BT, params=reference.params).logits)
    error = float(np.abs(ours_BTV - theirs_BTV).max())
    print(f"max |logit difference| vs FlaxMistralForCausalLM (window {WINDOW}): {error:.2e}")
    assert error <= 1e-4 < np.abs(ours_BTV - wider_BTV).max() and np.abs(theirs_BTV).max() > 1e-2

    # greedy decoding through the KV cache, past the window: the reference picks each of our tokens next
    prompt_BT = np.asarray([tok.encode("the king and").ids], np.int32)
    ours_BT, p = np.asarray(generate(run.model, prompt_BT, 3 * WINDOW, temperature=0.0)), prompt_BT.shape[1]
    theirs_next_BT = np.asarray(reference(ours_BT[:, :-1]).logits).argmax(-1)[:, p - 1 :]
    assert theirs_next_BT.tolist() == ours_BT[:, p:].tolist()


def test_import_export_gives_back_a_mistrals_tensors_and_window(hub, run_cli, text_glob, tmp_path):
    _, _, folder = hub
    import_hub(run_cli, folder, tmp_path / "run", text_glob)
    code, lines = run_cli(export_cli.main, str(tmp_path / "run"), str(tmp_path / "out"))
    assert code == 0, lines
    ours, theirs = load_file(tmp_path / "out" / "model.safetensors"), load_file(folder / "model.safetensors")
    assert sorted(ours) == sorted(theirs) and all(np.array_equal(ours[n], theirs[n]) for n in theirs)
    exported = MistralConfig.from_pretrained(tmp_path / "out")
    assert (exported.architectures, exported.sliding_window, exported.head_dim) == (["MistralForCausalLM"], WINDOW, 8)
