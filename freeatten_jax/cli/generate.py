"""`freeatten-generate`: a trained run's checkpoint + a prompt -> text, with the run's own tokenizer.

    freeatten-generate --workdir=runs/lssar-tiny --prompt="ROMEO:" --max_new_tokens=200 --top_p=0.9 --num_samples=4

The samples go to stdout (each the prompt and its continuation; several are separated by a line of dashes);
the checkpoint step and the sampling speed go to stderr.
"""

import sys

from absl import flags, logging

from freeatten_jax.cli import shared as cli

SEPARATOR = "-" * 40


def speed_line(step: int, samples: int, max_new: int, timing: dict) -> str:
    """The stderr line after the samples: the first token's latency and the rate of the tokens after it (none to time
    when every sample stopped at its first token)."""
    after = timing["tokens_after_first"]
    rate = (
        f"then {after / timing['after_first_s']:,.1f} tokens/s"
        if after
        else "no later token to time (every sample stopped at its first)"
    )
    return (
        f"checkpoint step {step}; {samples} sample(s) x up to {max_new} tokens: first token after "
        f"{timing['first_token_s']:.2f} s (compilation included), {rate}"
    )


def main() -> None:
    workdir = flags.DEFINE_string(
        "workdir", None, "Training run directory, or WORKDIR@STEP for one of its checkpoints.", required=True
    )
    prompt = flags.DEFINE_string("prompt", None, "Text to continue.", required=True)
    step = flags.DEFINE_integer(
        "step", None, "Checkpoint step to load (default: WORKDIR@STEP's, else the latest).", lower_bound=0
    )
    max_new = flags.DEFINE_integer("max_new_tokens", 100, "Tokens to generate at most.", lower_bound=1)
    num_samples = flags.DEFINE_integer("num_samples", 1, "Continuations to sample, as one batch.", lower_bound=1)
    temperature = flags.DEFINE_float("temperature", 1.0, "Sampling temperature; 0 is greedy.", lower_bound=0.0)
    top_k = flags.DEFINE_integer("top_k", None, "Sample among the k most likely tokens only.", lower_bound=1)
    top_p = flags.DEFINE_float(
        "top_p", None, "Nucleus sampling: the smallest set of tokens with this probability.", lower_bound=0.0, upper_bound=1.0
    )
    eos = flags.DEFINE_string("eos", None, "Stop after this text (one token), e.g. a newline.")
    seed = flags.DEFINE_integer("seed", 0, "Sampling seed.")

    def run(_):
        from freeatten_jax.training.run_dir import load_run

        loaded, timing = load_run(workdir.value, step=step.value), {}
        texts = loaded.generate(
            prompt.value,
            max_new.value,
            num_samples=num_samples.value,
            temperature=temperature.value,
            top_k=top_k.value,
            top_p=top_p.value,
            eos=eos.value,
            seed=seed.value,
            timing=timing,
        )
        print(f"\n{SEPARATOR}\n".join(prompt.value + text for text in texts))
        print(speed_line(loaded.step, len(texts), max_new.value, timing), file=sys.stderr)

    cli.run(run, sys.argv, verbosity=logging.ERROR)  # orbax read-only notices would mix with the text
