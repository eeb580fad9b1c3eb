"""`--help` of every command: its docstring, its own flags and, for commands with --config, the whole config tree;
each entry with its default, type and allowed values, derived from the flag definitions and the config schema."""

import dataclasses
import sys

from absl import flags
from ml_collections import config_flags

from freeatten_jax import configs

HELP_FLAGS = ("--help", "-h", "--helpfull", "--helpshort", "-?")
_REQUIRED = "must have a value other than None"  # absl's message for flags marked required


def _entry(name: str, value, kind: str, allowed: str | None, help_text: str) -> str:
    return f"  --{name}={value} ({kind}" + (f"; allowed: {allowed}" if allowed else "") + f")\n      {help_text}"


def _flag(flag) -> str:
    """One flag: default, type, allowed values (an enum's values, a bound, required) and its help."""
    enum = getattr(flag.parser, "enum_values", None)
    bounded = any(getattr(flag.parser, bound, None) is not None for bound in ("lower_bound", "upper_bound"))
    ours = not type(flag.parser).__module__.startswith("absl.")  # e.g. fields.FieldParser, whose help is its allowed values
    allowed = ", ".join(enum) if enum else flag.parser.syntactic_help if bounded or ours else None
    kind = flag.flag_type() + (", required" if any(_REQUIRED in v.message for v in flag.validators) else "")
    help_text = flag.help.split(": ", 1)[1] if enum and flag.help.startswith("<") else flag.help
    return _entry(flag.name, flag.default, kind, allowed, help_text.split(";\n")[0])  # absl appends multi flags' usage


def _loaded(argv: list[str]):
    """The config of the command line's --config (and --config.* overrides), or `lm`'s defaults without one."""
    args = [a for a in argv[1:] if a.startswith("--config")]
    if not any(a.startswith("--config=") for a in args):
        args.insert(0, f"--config={configs.resolve(configs.EXPERIMENT)}")
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True, sys_argv=[argv[0], *args])
    values([argv[0], *args])
    return values.config


def config_tree(cfg) -> str:
    """Every field of every section: `--config.SECTION.FIELD=VALUE (type; allowed: ...)` and its help."""
    from freeatten_jax.schema import help_text, optional, type_name
    from freeatten_jax.training.config import MODEL_NOTES, SECTIONS

    lines = []
    for section, cls in SECTIONS.items():
        lines.append(f"\n{section} ({cls.__name__}):")
        for f in dataclasses.fields(cls):
            note = MODEL_NOTES.get(f.name) if section == "model" else None
            value = cfg[section][f.name]
            value = value.to_dict() if hasattr(value, "to_dict") else value
            text = help_text(f) + (f"; {note}" if note else "")
            check = f.metadata.get("check")
            if value is None and check and not check[0](None):  # left open here, filled in by the application
                check = optional(check)
            lines.append(
                _entry(f"config.{section}.{f.name}", "''" if value == "" else value, type_name(f.type), check and check[1], text)
            )
    return "\n".join(lines)


def text(module: str, argv: list[str]) -> str:
    """The whole help of the command defined in `module`."""
    own = flags.FLAGS.flags_by_module_dict().get(module, [])
    if "config" in flags.FLAGS and flags.FLAGS["config"] not in own:
        own = [flags.FLAGS["config"], *own]
    parts = [(sys.modules[module].__doc__ or "").strip(), "Flags:", *map(_flag, own)]
    if "config" in flags.FLAGS:
        parts += [
            "\nConfig fields (override any with --config.SECTION.FIELD=VALUE; --config=NAME --help shows NAME's "
            f"values; packaged configs: {configs.PACKAGED}):",
            config_tree(_loaded(argv)),
        ]
    return "\n".join(parts)
