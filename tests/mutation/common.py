"""What every module of the mutation catalogue shares: the mutant's shape, the snippet check, the test paths
that several packages' mutants name.

Each mutant is a deliberate one-line bug: (name, file, exact original snippet, replacement, pytest arguments that must
fail on it).
"""

import pathlib
from typing import NamedTuple


class Mutant(NamedTuple):
    name: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]  # pytest arguments: paths / node ids, optionally "-k", expression


def misplaced(mutants, root: pathlib.Path) -> list[str]:
    """One line for each mutant whose snippet is not in its file exactly once (test_catalogue.py keeps it empty)."""
    counts = [(m, (root / m.file).read_text().count(m.original)) for m in mutants]
    return [
        f"mutant {m.name!r}: its original snippet occurs {n} times in {m.file} (must be once); update tests/mutation/"
        for m, n in counts
        if n != 1
    ]


HF_IMPORT = "tests/formats/test_hf_llama.py"
HF_EXPORT = "tests/formats/test_hf_export.py"
SWITCHES = "tests/evaluation/test_loss.py::test_each_switch_gives_the_model_it_names"
FAULTS = "tests/training/test_faults.py"
