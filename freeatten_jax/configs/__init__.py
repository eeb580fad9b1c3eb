"""Packaged experiment configs: `--config=lssar:tiny` names `freeatten_jax/configs/lssar.py` with argument `tiny`."""
import pathlib

ROOT = pathlib.Path(__file__).parent
NAMES = tuple(sorted(p.stem for p in ROOT.glob("*.py") if p.stem not in ("__init__", "base")))


def resolve(value: str) -> str:
    """`lssar:tiny` -> the packaged file's path with `:tiny`; a file path (`configs/lssar.py:tiny`) is kept."""
    name, sep, arg = value.partition(":")
    if name.endswith(".py") or "/" in name or name not in NAMES:
        return value
    return f"{ROOT / name}.py{sep}{arg}"
