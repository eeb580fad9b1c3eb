"""`freeatten-export`: a run's checkpoint as a Hugging Face Llama folder (config.json, model.safetensors,
generation_config.json and, when the run has a Hugging Face tokenizer, tokenizer.json), which transformers loads as a
LlamaForCausalLM (Mistral with a window, Qwen2 with q/k/v biases); the reverse of freeatten-import. Llama-shaped models
only (swiglu MLP, rmsnorm, no biases but Qwen2's: the ssmax_162m preset, an import). The special token ids are those of
the Hugging Face folder the run's weights came from (null for a run trained here).

    freeatten-export runs/smollm2-lssar OUT_DIR        # the latest checkpoint; WORKDIR@STEP for another

A model with another attention than softmax (LSSA, LSSAR, SSMax, ...) is exported with its attention's settings in
config.json (freeatten_attention): transformers ignores them and would run it with softmax attention.
"""

import sys

from absl import logging

from freeatten_jax.cli import shared as cli
from freeatten_jax.errors import UserError


def main() -> None:
    paths = [a for a in sys.argv[1:] if not a.startswith("-")]

    def run(_):
        from freeatten_jax.data.tokenizer import FileTokenizer
        from freeatten_jax.formats import hf_export
        from freeatten_jax.training import hub_tokens, run_dir, warm_start

        if len(paths) != 2:
            raise UserError(f"give a run and an output folder (got {len(paths)} paths): freeatten-export WORKDIR[@STEP] OUT")
        loaded, out = run_dir.load_run(paths[0]), paths[1]
        model = loaded.config.model
        tokenizer_json = loaded.tokenizer.to_str() if isinstance(loaded.tokenizer, FileTokenizer) else None
        params = warm_start.flat_params(loaded.model)
        special = hub_tokens.special_tokens(loaded.workdir)
        written = hf_export.export(model, loaded.config.train.seq_len, params, tokenizer_json, out, special)
        print(f"exported {loaded.workdir}@{loaded.step} ({model.variant_name}) to {out}: {', '.join(written)}")
        if tokenizer_json is None:
            tokenizer = loaded.config.data.tokenizer
            print(f"{loaded.workdir} has no Hugging Face tokenizer (data.tokenizer={tokenizer}): {out} has none")
        if model.attention != "softmax":
            print(
                f"note: transformers cannot run {model.attention} attention as is (it would run softmax); config.json "
                f"records it under {hf_export.ATTENTION_KEY}"
            )

    cli.run(run, [sys.argv[0], *(a for a in sys.argv[1:] if a not in paths)], verbosity=logging.ERROR)
