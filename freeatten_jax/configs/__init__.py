"""Packaged experiment configs: `--config=lm:variant=lssar,size=tiny` names `lm.py` with its named arguments
(`mqar:variant=lssar` names `mqar.py`); each attention variant's or control's name is an alias for the language
model (`lssar:tiny` = `lm:variant=lssar,size=tiny`)."""

import pathlib

from freeatten_jax.attention import VARIANTS
from freeatten_jax.configs.base import CONTROLS
from freeatten_jax.nn.presets import SIZES

ROOT = pathlib.Path(__file__).parent
EXPERIMENT = "lm"  # the default one (`--help` without --config)
EXPERIMENTS = (EXPERIMENT, "mqar")
NAMES = (*VARIANTS, *CONTROLS)
PACKAGED = f"{EXPERIMENT}:variant=V,size=S or V:S, mqar:variant=V,form=F; variants: {', '.join(NAMES)}; sizes: {', '.join(SIZES)}"


def resolve(value: str) -> str:
    """`lm:ARGS`, `mqar:ARGS` or `lssar:tiny` -> the packaged file's path with named arguments; a file path is kept."""
    name, sep, arg = value.partition(":")
    if name in EXPERIMENTS:
        return f"{ROOT / name}.py{sep}{arg}"
    if name in NAMES:
        return f"{ROOT / EXPERIMENT}.py:variant={name}" + (f",size={arg}" if arg else "")
    return value
