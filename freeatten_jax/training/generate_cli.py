"""`freeatten-generate`: a trained run's checkpoint + a prompt -> text, with the run's own tokenizer.

    freeatten-generate --workdir=runs/lssar-tiny --prompt="ROMEO:" --max_new_tokens=200 --top_p=0.9
"""
import sys

import numpy as np
from absl import flags, logging

from freeatten_jax import cli
from freeatten_jax.errors import UserError


def generate_text(workdir, prompt: str, max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
                  top_p: float | None = None, eos: str | None = None, seed: int = 0) -> str:
    """The continuation of `prompt` (prompt excluded) sampled from the run's latest checkpoint."""
    from freeatten_jax import data
    from freeatten_jax.nn.decoding import generate
    from freeatten_jax.training import checkpoint

    model, cfg, _ = checkpoint.load_params(workdir)
    tokenizer = data.run_tokenizer(workdir, cfg.data)
    if tokenizer is None:
        raise UserError(f"run {workdir} trained on pre-tokenized .bin shards without data.tokenizer_path: "
                        f"it has no tokenizer to encode a prompt")
    prompt_T = np.asarray(tokenizer.encode(prompt), np.int32)
    if not len(prompt_T):
        raise UserError("the prompt is empty")
    eos_id = None
    if eos is not None:
        eos_ids = tokenizer.encode(eos)
        if len(eos_ids) != 1:
            raise UserError(f"--eos={eos!r} is {len(eos_ids)} tokens; it must be exactly one")
        eos_id = int(eos_ids[0])
    out = generate(model, prompt_T[None], max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, eos_id=eos_id, seed=seed)
    new_T = np.asarray(out[0, len(prompt_T):])
    if eos_id is not None and (eos_id == new_T).any():
        new_T = new_T[: int(np.argmax(new_T == eos_id)) + 1]
    return tokenizer.decode(new_T)


def main() -> None:
    workdir = flags.DEFINE_string("workdir", None, "Training run directory (its latest checkpoint).", required=True)
    prompt = flags.DEFINE_string("prompt", None, "Text to continue.", required=True)
    max_new = flags.DEFINE_integer("max_new_tokens", 100, "Tokens to generate at most.", lower_bound=1)
    temperature = flags.DEFINE_float("temperature", 1.0, "Sampling temperature; 0 is greedy.", lower_bound=0.0)
    top_k = flags.DEFINE_integer("top_k", None, "Sample among the k most likely tokens only.", lower_bound=1)
    top_p = flags.DEFINE_float("top_p", None, "Nucleus sampling: the smallest set of tokens with this probability.",
                               lower_bound=0.0, upper_bound=1.0)
    eos = flags.DEFINE_string("eos", None, "Stop after this text (one token), e.g. a newline.")
    seed = flags.DEFINE_integer("seed", 0, "Sampling seed.")

    def run(_):
        text = generate_text(workdir.value, prompt.value, max_new.value, temperature=temperature.value, top_k=top_k.value,
                             top_p=top_p.value, eos=eos.value, seed=seed.value)
        print(prompt.value + text)

    cli.run(run, sys.argv, verbosity=logging.ERROR)  # orbax read-only notices would mix with the text
