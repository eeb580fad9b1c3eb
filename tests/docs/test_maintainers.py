"""docs/maintainers.md names only files that exist: the page of which files each kind of change touches stays true."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PATH = re.compile(r"`((?:freeatten_jax|tests|benchmarks|docs|scripts)/[\w/]+\.(?:py|md))`")


def test_every_file_it_names_exists():
    named = set(PATH.findall((ROOT / "docs" / "maintainers.md").read_text()))
    assert len(named) > 25 and sorted(n for n in named if not (ROOT / n).is_file()) == []


def test_every_kind_of_change_has_its_section():
    headings = re.findall(r"^## (.+)$", (ROOT / "docs" / "maintainers.md").read_text(), re.M)
    kinds = ("variant", "kernel schedule", "evaluation task", "checkpoint", "config field")
    assert [kind for kind in kinds if not any(kind in h for h in headings)] == []


def test_every_name_a_row_gives_is_in_its_file():
    """In a row `| file | what changes |`, each code name (`VARIANTS`, `_cell`) is defined or used in that file."""
    rows = re.findall(r"^\| `([\w/]+\.py)` \| (.+) \|$", (ROOT / "docs" / "maintainers.md").read_text(), re.M)
    names = [(file, name) for file, text in rows for name in re.findall(r"`([A-Za-z_]\w*)`", text)]
    assert len(names) > 15 and [(f, n) for f, n in names if not re.search(rf"\b{n}\b", (ROOT / f).read_text())] == []
