"""The mutation catalogue (tests/mutation/) matches the tree, so that `make mutants` can apply every mutant and run the
tests it names: a moved snippet or a renamed test fails here at once, not at the next mutation run."""

import pathlib

from . import MUTANTS, misplaced

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_mutants_snippet_is_in_its_file_exactly_once():
    assert misplaced(MUTANTS, ROOT) == []


def _there(arg: str) -> bool:
    """Whether a pytest argument's file exists and, for a node id, defines its test function."""
    path, _, node = arg.partition("::")
    file = ROOT / path
    return file.exists() and (not node or f"def {node.split('[')[0]}(" in file.read_text())


def test_every_test_a_mutant_names_is_there():
    named = [(m.name, arg) for m in MUTANTS for arg in m.tests if arg.startswith("tests/")]
    assert len(named) > 100 and [(name, arg) for name, arg in named if not _there(arg)] == []
