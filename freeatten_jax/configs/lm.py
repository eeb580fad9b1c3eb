"""The language-model experiment, with named arguments: `--config=lm:variant=lssar,size=gpt2_small` (all optional;
variants: softmax ssmax lssa lssar sigmoid relu; sizes: tiny gpt2_small ssmax_162m). `lssar:tiny` is short for it.
`init=PATH` warm-starts from a trained run (WORKDIR[@STEP]) or a Hugging Face Llama folder, whose model sizes, tokenizer
and training length replace the size's (training.warm_start).

    freeatten-train --config=lm:variant=lssar,size=tiny --workdir=runs/lssar-tiny
    freeatten-train --config=lssar:gpt2_small --workdir=runs/lssar-small \
        --config.data.path='fineweb10B/fineweb_train_*.bin' --config.data.val_path='fineweb10B/fineweb_val_*.bin'
    freeatten-train --config=ssmax:ssmax_162m --workdir=runs/ssmax-162m --config.data.path=... --config.data.val_path=...
    freeatten-train --config=lm:variant=lssar,init=runs/smollm2-135m --workdir=runs/smollm2-lssar --config.data.path=...
"""

from freeatten_jax.configs import base
from freeatten_jax.errors import ConfigError

ARGUMENTS = ("variant", "size", "init")


def arguments(text: str, allowed: tuple[str, ...] = ARGUMENTS, experiment: str = "lm") -> dict:
    """`variant=lssar,size=tiny` as a dict; an unknown name or an item without `=` is a ConfigError."""
    named = dict(item.partition("=")[::2] for item in text.split(",") if item)
    wrong = [name for name in named if name not in allowed] + [item for item in text.split(",") if item and "=" not in item]
    if wrong:
        raise ConfigError(
            f"--config={experiment}:{text}: {wrong[0]!r} is not a named argument; allowed: "
            + ", ".join(f"{name}=..." for name in allowed)
        )
    return named


def get_config(text: str = ""):
    return base.get_config(**arguments(text))
