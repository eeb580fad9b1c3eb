"""Config fields declared once on frozen dataclasses: `option(default, help, check)`; validation and help derive from it.

A check is (predicate, allowed values as text); `validate` raises ConfigError naming the field and its allowed values.
"""

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from freeatten_jax.errors import ConfigError

Check = tuple[Callable[[Any], bool], str]


def option(default: Any = dataclasses.MISSING, *, help: str, check: Check | None = None, factory=dataclasses.MISSING, **marks):
    """A dataclass field with its one-line help, its check (None: any value of its type) and any `marks` its users read
    (e.g. the evaluation's `shapes`)."""
    return dataclasses.field(default=default, default_factory=factory, metadata={"help": help, "check": check, **marks})


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def integer(low: int, high: int | None = None) -> Check:
    ok = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low and (high is None or v <= high)
    return ok, f"an integer >= {low}" + (f" and <= {high}" if high is not None else "")


def number(ok: Callable[[float], bool], text: str) -> Check:
    """A real number (not a bool) for which `ok` holds; NaN fails every comparison, so `ok` refuses it."""
    return (lambda v: _is_number(v) and ok(v)), text


def one_of(choices) -> Check:
    return (lambda v: v in choices), "one of " + ", ".join(map(repr, choices))


def optional(check: Check) -> Check:
    """`check`, or None (the field's help says what None means)."""
    ok, text = check
    return (lambda v: v is None or ok(v)), f"None or {text}"


BOOL: Check = ((lambda v: isinstance(v, bool)), "True or False")
POSITIVE = number(lambda v: v > 0, "a number > 0")
FINITE_POSITIVE = number(lambda v: math.isfinite(v) and v > 0, "a finite number > 0")
FRACTION = number(lambda v: 0 <= v < 1, "a number in [0, 1)")


def validate(cls, values: Mapping[str, Any], prefix: str) -> None:
    """Raises ConfigError for the first of `values` (fields of `cls`) that fails its field's check."""
    for f in dataclasses.fields(cls):
        check = f.metadata.get("check")
        if check and f.name in values and not check[0](value := values[f.name]):
            raise ConfigError(f"{prefix}{f.name}={value!r} is invalid; allowed: {check[1]}")


def help_text(f: dataclasses.Field) -> str:
    return f.metadata.get("help", "")


def base_type(annotation) -> type:
    """The type a value of the field has when given (`float | None` -> float, `Literal['a']` -> str)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return base_type(next(a for a in typing.get_args(annotation) if a is not type(None)))
    if origin is typing.Literal:
        return type(typing.get_args(annotation)[0])
    return origin or annotation


def type_name(annotation) -> str:
    """The field's type for people: `int`, `float | None`, `str`, `tuple`."""
    name = getattr(base_type(annotation), "__name__", "any")
    args = typing.get_args(annotation)
    return f"{name} | None" if type(None) in args else name
