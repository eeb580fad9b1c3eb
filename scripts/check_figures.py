"""Re-checks every measured figure in docs/results.md and the README against the files it was read off.

A document names its sources in markers, each applying until the next one:

    <!-- figures: results/report.md results/mqar.csv -->   (paths relative to the document)
    <!-- figures: off -->                                  (prose whose numbers are not results: setups, benchmarks)

Every decimal figure under a marker (1.821, +0.277, [-0.803, -0.411], 0.30x, 1.3x) must equal, at the decimals it is
printed with, a number in one of its sources: a figure printed in a report's tables (rounded further if the document
prints fewer decimals) or a CSV cell rounded to those decimals. Figures quoted from the papers and constants of the
method live in docs/results/quoted.csv (figure, what, source), which every marker includes. In docs/results.md a
figure before the first marker is an error; the README is checked only under markers. Integers, percentages, times
and code blocks are not checked.

    python scripts/check_figures.py            # one line per figure not found; exit 1 if any
"""

import csv
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCUMENTS = {"docs/results.md": True, "README.md": False}  # path: whether text before the first marker is checked
QUOTED = "docs/results/quoted.csv"
# a number with decimals, not inside a word or another number; "1.27-1.32x" is two
FIGURE = re.compile(r"(?:(?<=\d-)|(?<![\w.\-−/]))([+\-−]?\d+\.\d+)x?(?!\w|\.\d)")
MARKER = re.compile(r"<!-- figures: (.*?) -->")


def _normal(text: str) -> str:
    """One spelling per number: ASCII minus, no plus sign, no minus on zero."""
    text = text.replace("−", "-").lstrip("+")
    return text.removeprefix("-") if float(text) == 0 else text


def _decimals(text: str) -> int:
    return len(text.split(".")[1])


def _rounded(value: float, decimals: int) -> str:
    return _normal(f"{value:.{decimals}f}")


class Sources:
    """The numbers of some files, as printed (report tables) and as stored (CSV cells)."""

    def __init__(self, paths: list[pathlib.Path]):
        self.printed: set[str] = set()
        self.values: list[float] = []
        for path in paths:
            if path.suffix == ".csv":
                with path.open() as f:
                    for row in csv.reader(f):
                        self.values += [float(cell) for cell in row if _is_number(cell)]
            else:
                self.printed |= {_normal(m.group(1)) for m in FIGURE.finditer(path.read_text())}

    def has(self, figure: str) -> bool:
        decimals = _decimals(figure)
        if figure in self.printed:
            return True
        for printed in self.printed:  # a report's figure the document prints with fewer decimals
            if _decimals(printed) > decimals and _rounded(float(printed), decimals) == figure:
                return True
        return any(_rounded(v, decimals) == figure for v in self.values)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def unfound(document: pathlib.Path, checked_before_marker: bool, quoted: pathlib.Path = ROOT / QUOTED) -> list[str]:
    """One line per figure of `document` that none of its sources holds (or that has no source); `quoted` is part of
    every marker's sources."""
    lines, in_code = [], False
    sources: Sources | str | None = "no marker above it" if checked_before_marker else None  # None: not checked
    for number, line in enumerate(document.read_text().splitlines(), 1):
        in_code ^= line.startswith("```")
        if in_code or line.startswith("```"):
            continue
        if marker := MARKER.search(line):
            names = marker.group(1).split()
            sources = None if names == ["off"] else Sources([document.parent / n for n in names] + [quoted])
            continue
        if sources is None:
            continue
        for m in FIGURE.finditer(re.sub(r"\]\([^)]*\)|`[^`]*`", "", line)):  # link targets and code spans are names
            where = f"{document}:{number}: {m.group(0)}"
            if isinstance(sources, str):
                lines.append(f"{where} has no source ({sources})")
            elif not sources.has(_normal(m.group(1))):
                lines.append(f"{where} is in none of its sources")
    return lines


def main() -> None:
    problems = [line for path, strict in DOCUMENTS.items() for line in unfound(ROOT / path, strict)]
    problems = [line.removeprefix(f"{ROOT}/") for line in problems]
    print("\n".join(problems) or f"every figure in {', '.join(DOCUMENTS)} is in its sources")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
