"""docs/drop_in.md's Python snippets run as written, each in a fresh namespace."""

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "drop_in.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_three_cases_are_there():
    assert len(BLOCKS) == 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_snippet_runs(index):
    exec(compile(BLOCKS[index], f"{DOC}:block{index}", "exec"), {"__name__": "drop_in"})
