"""The evaluation's settings, each declared once: its default, help, check and which kind of run it shapes (`shapes`:
text and/or mqar). freeatten-eval's flags, their validation and --help, and the comparability of results measured
under other settings (`compared`) all derive from these fields."""

import dataclasses
import typing

from freeatten_jax.attention import IMPLEMENTATIONS
from freeatten_jax.data.mqar import PLACEMENTS
from freeatten_jax.data.ruler import TASKS
from freeatten_jax.schema import Check, integer, number, option

TEXT, MQAR = "text", "mqar"  # the kinds of run a setting shapes


def _each(ok, text: str) -> Check:
    """A tuple (or list) whose every item passes `ok`."""
    return (lambda v: isinstance(v, (tuple, list)) and all(ok(x) for x in v)), text


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclasses.dataclass(frozen=True)
class Settings:
    multipliers: tuple[int, ...] = option(
        (1, 2, 4, 8, 16),
        help="Evaluation lengths in training lengths.",
        check=_each(lambda m: _is_int(m) and m >= 1, "integers >= 1 (lengths in training lengths), e.g. 1,2,4"),
        shapes=(TEXT, MQAR),
    )
    eval_tokens: int = option(
        0,
        help="Held-out tokens scored at every length (cut into windows of each length); 0: span_windows windows of the "
        "longest length.",
        check=integer(0),
        shapes=(TEXT,),
    )
    span_windows: int = option(
        16, help="Windows of the longest length in the held-out span when eval_tokens is 0.", check=integer(1), shapes=(TEXT,)
    )
    passkey_depths: tuple[float, ...] = option(
        (0.1, 0.5, 0.9),
        help="Needle depths (0 = start, 1 = end).",
        check=_each(lambda d: _is_number(d) and 0 <= d <= 1, "numbers in [0, 1], e.g. 0.1,0.5"),
        shapes=(TEXT,),
    )
    passkey_keys: int = option(3, help="Random keys per passkey cell.", check=integer(1), shapes=(TEXT,))
    passkey_candidates: int = option(
        10, help="Keys ranked by likelihood, the true one included.", check=integer(1), shapes=(TEXT,)
    )
    analysis_windows: int = option(
        1, help="Windows of the longest length for the entropy analysis.", check=integer(1), shapes=(TEXT,)
    )
    implementation: typing.Literal[tuple(IMPLEMENTATIONS)] = option("auto", help="Attention implementation at every length.")
    seed: int = option(0, help="Seed of the passkey keys and the RULER examples.", check=integer(0), shapes=(TEXT,))
    context: int = option(
        1,
        help="Devices sharing each window's sequence (context parallelism; lengths must be multiples of 2x it) for the "
        "loss vs length, and each retrieval prompt's KV cache (prefilled round the ring, decoded on every device's slots).",
        check=integer(1),
    )
    ruler: tuple[str, ...] = option(
        (),
        help="RULER-style tasks scored at every length (docs/method.md), e.g. niah_single,vt; none by default.",
        check=_each(lambda t: t in TASKS, f"some of {', '.join(TASKS)}"),
        shapes=(TEXT,),
    )
    ruler_examples: int = option(
        4, help="Examples per RULER task and length (the same keys and needles at each length).", check=integer(1), shapes=(TEXT,)
    )
    ruler_candidates: int = option(
        10, help="Answers each RULER reference is ranked among by likelihood, itself included.", check=integer(2), shapes=(TEXT,)
    )
    ruler_keep: float = option(
        0.85,
        help="RULER effective length: the longest multiplier up to which the score keeps this fraction of the shortest length's.",
        check=number(lambda v: 0 < v <= 1, "a number in (0, 1]"),
    )
    mqar_instances: int = option(
        256,
        help="MQAR runs: instances per length (each queries every pair; the same instances at every length).",
        check=integer(1),
        shapes=(MQAR,),
    )
    mqar_placements: tuple[str, ...] = option(
        PLACEMENTS,
        help="MQAR runs: where the training window's pairs sit at longer lengths: start (as in training, noise before "
        "the queries), end (noise first: the queries reach back as far as in training) and/or dilute (as end, with "
        "competing pairs of unqueried keys in the noise, as dense as in training).",
        check=_each(lambda p: p in PLACEMENTS, f"some of {', '.join(PLACEMENTS)}"),
        shapes=(MQAR,),
    )

    def __post_init__(self):
        object.__setattr__(self, "multipliers", tuple(sorted(self.multipliers)))  # ascending: the last is the longest

    def quick(self) -> "Settings":
        """A first look in minutes on a CPU: three lengths, a quarter of the span, one passkey depth and key, 64 MQAR
        instances."""
        return dataclasses.replace(
            self,
            multipliers=(1, 4, 16),
            span_windows=4,
            passkey_depths=(0.5,),
            passkey_keys=1,
            passkey_candidates=5,
            mqar_instances=64,
        )


def compared(cls: type, mqar: bool) -> tuple[str, ...]:
    """The settings (fields of `cls`, in their order) that shape what a text run measures, and with `mqar` also an MQAR
    run's: results measured under different values of one of them do not compare."""
    kinds = {TEXT, MQAR} if mqar else {TEXT}
    return tuple(f.name for f in dataclasses.fields(cls) if kinds & set(f.metadata.get("shapes", ())))
