"""Weights saved by transformers 4's Flax `save_pretrained(safe_serialization=True)`: model.safetensors under Flax's
names (`lm_head.kernel` [in, out], `model.embed_tokens.embedding`), not torch's. freeatten-import reads them as the
torch names they stand for: the run gives the saved FlaxLlama's logits.
"""

import numpy as np
from helpers import HUB, hub_tokenizer, import_hub
from safetensors import safe_open
from transformers import FlaxLlamaForCausalLM, LlamaConfig

from freeatten_jax.training.run_dir import load_run

TEXT = "the king and the queen and the lord of the night"


def test_flax_named_safetensors_are_imported_with_the_references_logits(run_cli, text_glob, tmp_path):
    tok = hub_tokenizer(text_glob)
    reference = FlaxLlamaForCausalLM(LlamaConfig(vocab_size=tok.get_vocab_size(), **HUB), seed=0)
    reference.save_pretrained(tmp_path / "hub", safe_serialization=True)
    (tmp_path / "hub" / "tokenizer.json").write_text(tok.to_str())
    with safe_open(tmp_path / "hub" / "model.safetensors", framework="numpy") as f:
        assert {"lm_head.kernel", "model.embed_tokens.embedding"} <= set(f.keys())
    import_hub(run_cli, tmp_path / "hub", tmp_path / "run", text_glob)
    run = load_run(tmp_path / "run")
    tokens_BT = np.asarray([tok.encode(TEXT).ids], np.int32)
    ours_BTV, theirs_BTV = np.asarray(run.model(tokens_BT)), np.asarray(reference(tokens_BT).logits)
    assert np.abs(ours_BTV - theirs_BTV).max() <= 1e-4 and np.abs(theirs_BTV).max() > 1e-2
