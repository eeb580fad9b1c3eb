"""Choosing per platform while tracing: one program that holds each platform's branch, so a lowering for another
platform (`lowering_platforms=`, a compile for a chip from this machine) gets that platform's choice."""

from collections.abc import Callable, Hashable
from typing import TypeVar

import jax

Choice = TypeVar("Choice", bound=Hashable)

KINDS = {"cpu": "cpu", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}  # jax's platform names -> the kind of machine


def platform_dependent(choose: Callable[[str], Choice], run: Callable[[Choice], Callable], *args):
    """run(choose(platform))(*args) on the platform the program runs on: `choose` names what each of jax's platforms
    (KINDS) runs; one choice for all is called directly, several go through jax.lax.platform_dependent."""
    choices = {platform: choose(platform) for platform in KINDS}
    if len(set(choices.values())) == 1:
        return run(choices["cpu"])(*args)
    return jax.lax.platform_dependent(*args, **{platform: run(choice) for platform, choice in choices.items()})
