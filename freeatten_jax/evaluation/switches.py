"""Eval-time switches (no retraining): LSSAR re-weighting p, RoPE theta, SSMax s, RoPE scaling (linear or llama3).

A switch is written `key=value[,key=value][@variant+variant]`, e.g. `p=15`, `p=off`, `s=0.3`, `rope_linear=4`, or
`rope_theta=50x@softmax+ssmax` (only on those variants' checkpoints: the SSMax paper's protocol).
"""

import dataclasses

from freeatten_jax import attention
from freeatten_jax.errors import ConfigError
from freeatten_jax.nn.rope import Scaling

REWEIGHTABLE = ("lssa", "lssar")


@dataclasses.dataclass(frozen=True)
class Switch:
    label: str  # as given without its @variants, or "none" for the checkpoint as trained
    settings: tuple[tuple[str, str], ...] = ()
    variants: tuple[str, ...] = ()  # only checkpoints of these variants (all if empty)


def _p(model, cfg, value: str) -> None:
    """Re-weighting p on an LSSA or LSSAR checkpoint; `off` gives plain LSSA."""
    if cfg.model.attention not in REWEIGHTABLE:
        raise ValueError(f"switch p applies to lssa/lssar checkpoints, not {cfg.model.attention!r}")
    kept = {k: v for k, v in dict(cfg.model.attention_options).items() if k != "p"}  # a frozen temperature stays
    model.set_attention("lssar", **kept, p=None if value == "off" else float(value))


def _rope_theta(model, cfg, value: str) -> None:
    """A RoPE base, absolute (500000) or relative to the trained one (50x)."""
    theta = cfg.model.rope_theta * float(value[:-1]) if value.endswith("x") else float(value)
    model.set_rope_theta(theta)


def _s(model, cfg, value: str) -> None:
    """Overrides the learned SSMax s of every layer and head."""
    if cfg.model.attention != "ssmax":
        raise ValueError(f"switch s applies to ssmax checkpoints, not {cfg.model.attention!r}")
    model.set_ssmax_s(float(value))


def _rope_scaling(kind: str):
    """The switch to RoPE scaling `kind` by the factor given (in place of the checkpoint's scaling, its base kept);
    llama3 with its other fields at Llama 3.1's and the trained length as the length before scaling."""

    def scale(model, cfg, value: str) -> None:
        model.set_rope_scaling(Scaling(kind, float(value), original_len=cfg.model.max_len))

    return scale


APPLY = {
    "p": _p,
    "rope_theta": _rope_theta,
    "s": _s,
    "rope_linear": _rope_scaling("linear"),
    "rope_llama3": _rope_scaling("llama3"),
}
NONE = Switch("none")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse(text: str) -> Switch:
    """`p=15,rope_theta=50x[@lssa+lssar]` -> Switch; unknown keys, variants or malformed items raise ConfigError."""
    text, _, only = text.partition("@")
    variants = tuple(v for v in only.split("+") if v)
    if unknown := [v for v in variants if v not in attention.VARIANTS]:
        raise ConfigError(f"switch variant {unknown[0]!r} is unknown; valid variants: {', '.join(attention.VARIANTS)}")
    settings = []
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise ConfigError(f"switch item {item!r} is not key=value (in {text!r})")
        if key not in APPLY:
            raise ConfigError(f"unknown switch {key!r} in {text!r}; valid switches: {', '.join(APPLY)}")
        number = value[:-1] if key == "rope_theta" and value.endswith("x") else value
        if not (key == "p" and value == "off" or _is_number(number)):
            raise ConfigError(f"switch {key}={value!r} is not a number (in {text!r})")
        settings.append((key, value))
    return Switch(text, tuple(settings), variants)


def apply(model, cfg, switch: Switch) -> None:
    """Applies the switch to a freshly loaded model (in place)."""
    for key, value in switch.settings:
        APPLY[key](model, cfg, value)


def _trained_p(cfg) -> str:
    """The checkpoint's own re-weighting, as a switch value: 'off' for lssa, else its p."""
    if cfg.model.attention == "lssa":
        return "off"
    p = dict(cfg.model.attention_options).get("p", attention.VARIANTS["lssar"].defaults["p"])
    return "off" if p is None else str(float(p))


def skipped(cfg, switch: Switch) -> str | None:
    """Why the switch gives no row of its own on this checkpoint (another variant's switch, or the checkpoint's own
    setting: p=15 on a p=15 LSSAR run), in a line; None where it applies."""
    variant, needs = cfg.model.attention, {"p": REWEIGHTABLE, "s": ("ssmax",)}
    if switch.variants and variant not in switch.variants:
        return f"switch {switch.label} is for {'/'.join(switch.variants)} checkpoints, not {variant}"
    if wrong := [key for key, _ in switch.settings if variant not in needs.get(key, (variant,))]:
        return f"switch {wrong[0]} applies to {'/'.join(needs[wrong[0]])} checkpoints, not {variant}"
    normalise = lambda value: value if value == "off" else str(float(value))
    if switch.settings and all(key == "p" and normalise(value) == _trained_p(cfg) for key, value in switch.settings):
        return f"{switch.label} is {variant}'s own p: no extra row"
    return None


def applicable(cfg, switch: Switch) -> bool:
    """Whether the switch suits this checkpoint's variant and changes something (`skipped` says why not)."""
    return skipped(cfg, switch) is None
