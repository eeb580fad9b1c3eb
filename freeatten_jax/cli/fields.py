"""Flags derived from a frozen dataclass of `schema.option` fields: one flag per field, with its default, help and
check (a tuple field: comma separated values); `value` turns the parsed flags back into an instance."""

import dataclasses
import typing

from absl import flags

from freeatten_jax.schema import Check, base_type, help_text


class FieldParser(flags.ArgumentParser):
    """A value of one field's type, or its comma separated values for a tuple field, refused unless the field's check
    holds; the check's text is the flag's allowed values in --help and in the error."""

    def __init__(self, annotation, check: Check | None, empty_ok: bool = False):
        super().__init__()
        self.empty_ok = empty_ok  # a tuple field off by default (empty) takes an empty value
        self.is_tuple = base_type(annotation) is tuple
        self.kind = typing.get_args(annotation)[0] if self.is_tuple else base_type(annotation)
        self.check, self.syntactic_help = check, check[1] if check else ""

    def flag_type(self) -> str:
        return f"comma separated list of {self.kind.__name__}" if self.is_tuple else self.kind.__name__

    def parse(self, argument):
        try:
            value = [self.kind(v) for v in flags.ListParser().parse(argument)] if self.is_tuple else self.kind(argument)
        except ValueError:
            value = None
        if value is None or value == [] and not self.empty_ok or self.check and not self.check[0](value):
            raise ValueError("is invalid" + (f"; allowed: {self.syntactic_help}" if self.check else ""))
        return value


def _default_text(default) -> str:
    return ",".join(map(str, default)) if isinstance(default, tuple) else str(default)


def define(cls, module: str, flag_values: flags.FlagValues = flags.FLAGS) -> dict[str, flags.FlagHolder]:
    """A flag for each field of `cls` (a Literal field: an enum flag; a bool field: --NAME/--noNAME), by field name,
    listed by --help as flags of `module` (the command's)."""
    holders = {}
    for f in dataclasses.fields(cls):
        where = {"flag_values": flag_values, "module_name": module}
        if typing.get_origin(f.type) is typing.Literal:
            holders[f.name] = flags.DEFINE_enum(f.name, f.default, list(typing.get_args(f.type)), help_text(f), **where)
        elif f.type is bool:
            holders[f.name] = flags.DEFINE_bool(f.name, f.default, help_text(f), **where)
        else:
            parser = FieldParser(f.type, f.metadata.get("check"), empty_ok=f.default == ())
            holders[f.name] = flags.DEFINE(parser, f.name, _default_text(f.default), help_text(f), **where)
    return holders


def value(cls, holders: dict[str, flags.FlagHolder]):
    """The instance of `cls` that the parsed flags `holders` (`define`'s) describe."""
    return cls(**{name: tuple(h.value) if isinstance(h.value, list) else h.value for name, h in holders.items()})
