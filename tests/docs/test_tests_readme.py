"""tests/README.md's table keeps the mirror complete: every library module has tests/<package>/test_<module>.py or a
row naming the files that cover it, and every row names a module and files that exist."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `([^`]+\.py)` \| (.+) \|$", re.M)


def _rows() -> dict[str, list[str]]:
    text = (ROOT / "tests" / "README.md").read_text()
    return {module: re.findall(r"`([^`]+)`", files) for module, files in ROW.findall(text)}


def _mirror(module: pathlib.Path) -> pathlib.Path:
    relative = module.relative_to(ROOT / "freeatten_jax")
    return ROOT / "tests" / relative.parent / f"test_{relative.name}"


def test_every_module_has_its_test_file_or_a_row():
    modules = [m for m in sorted((ROOT / "freeatten_jax").rglob("*.py")) if m.name != "__init__.py"]
    rows = _rows()
    orphans = [
        str(m.relative_to(ROOT))
        for m in modules
        if not _mirror(m).exists() and str(m.relative_to(ROOT / "freeatten_jax")) not in rows
    ]
    assert len(modules) > 100 and orphans == []


def test_every_row_names_a_module_and_test_files_that_exist():
    rows = _rows()
    assert len(rows) > 50
    stale = {module: files for module, files in rows.items() if not (ROOT / "freeatten_jax" / module).exists()}
    missing = [f for files in rows.values() for f in files if not (ROOT / f).is_file() or not f.startswith("tests/")]
    assert stale == {} and missing == []
