"""Packaged experiment configs: `--config=lm:variant=lssar,size=tiny` names `lm.py` with its named arguments; each
attention variant's name is an alias for it (`lssar:tiny` = `lm:variant=lssar,size=tiny`)."""
import pathlib

from freeatten_jax.attention import VARIANTS
from freeatten_jax.nn.presets import SIZES

ROOT = pathlib.Path(__file__).parent
EXPERIMENT = "lm"
PACKAGED = f"{EXPERIMENT}:variant=V,size=S or V:S; variants: {', '.join(VARIANTS)}; sizes: {', '.join(SIZES)}"


def resolve(value: str) -> str:
    """`lm:ARGS` or `lssar:tiny` -> the packaged file's path with named arguments; a file path is kept."""
    name, sep, arg = value.partition(":")
    if name == EXPERIMENT:
        return f"{ROOT / EXPERIMENT}.py{sep}{arg}"
    if name in VARIANTS:
        return f"{ROOT / EXPERIMENT}.py:variant={name}" + (f",size={arg}" if arg else "")
    return value
