"""Re-checks every measured figure in docs/results.md and the README by value: each cites its source, and the check
recomputes it there. A source is a named computation over the committed data (scripts/figures_data.py's SOURCES:
`text`, `mqar`, ...), a committed CSV (docs/results/, benchmarks/), or a table in a committed markdown file (the
tables benchmarks/RESULTS.md records as its benchmarks printed them). Markers:

    <!-- figures: text results/mqar.csv -->   a region: its figures are checked, and may cite these sources
    <!-- figures: off -->                     a region of setups and benchmarks: not checked
    <!-- cite: ADDRESS; ADDRESS; ... -->      the paragraph or table just above: one address per figure
    <!-- table: TEMPLATE; TEMPLATE; ... -->   the table just above: one address template per column

An address is `SOURCE#TABLE/ROW/COL`. SOURCE is a computation's name or a file relative to the document (default:
the region's first source); TABLE is part of a computed table's title, ROW its row (a variant, with its switch in
brackets; "(3 runs)" is ignored), COL its column. A CSV has no TABLE, and its ROW is `column=value,...` naming one
row. A markdown file's TABLE is part of one table's title (the heading above it and the paragraph just above it: a
heading may hold several tables), its ROW the row's first cells (`2048 | lssa | blockwise`; bold is ignored) or,
where no row's are, the start of one row's first cell (`softmax fwd` for `softmax fwd / backward`: no part of an
address holds a `/`). Omitted leading parts carry over from the previous address in the marker, so `16x` after
`Rise minus/lssar/8x` is `Rise minus/lssar/16x`; `COL[n]` is a CSV or markdown cell's n-th number, or a computed
cell's (its value, then each seed's). In a table template `{1}`, `{2}` are the row's first and second cells and
`{h}` the column's heading; the last template serves the remaining columns.

A figure group is a number, the intervals after it ([lo, hi]), a multiple right after those ((0.30x)) and a
Holm-adjusted p-value after them (p=0.04; one after another p is a figure alone); it must equal its source at the
decimals printed: the number the value (or its multiple, for `1.30x`), each interval the source's interval of the type
the document states, t (over seeds), bootstrap or range (lowest low, highest high). The document states it in a
table's caption and heading, in order, one per bracket of a cell (unless the cell names its own); in prose by the
nearest of "over seeds" or "t interval" (t), "bootstrap" (bootstrap) or "lowest low" (range) in the same sentence.
Figures quoted from the papers and the method's constants cite docs/results/quoted.csv
(`quoted.csv#figure=0.89/figure`). Every figure in a checked region must be cited; in docs/results.md that is every
figure after the first marker (before it, an error), in the README only those in regions. Integers, percentages,
times, links and code are not figures.

    python scripts/check_figures.py            # one line per figure that does not match; exit 1 if any
"""

import csv
import os
import pathlib
import re
import sys
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal

from scripts import figures_data

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCUMENTS = {  # path: whether text before the first marker is checked
    "docs/results.md": True,
    "README.md": False,
    "docs/reproduction.md": False,
    "docs/kernels.md": False,
    "docs/training.md": False,
    "docs/context_parallel.md": False,
}
QUOTED = "results/quoted.csv"  # relative to docs/
NUMBER = r"[+\-−]?\d+\.\d+"
# a bracketed interval, or a number with decimals not inside a word or another number ("1.27-1.32x" is two)
TOKEN = re.compile(rf"\[({NUMBER}), ({NUMBER})\]|(?:(?<=\d-)|(?<![\w.\-−/]))({NUMBER})(x?)(?!\w|\.\d)")
MARKER = re.compile(r"^\s*<!-- (figures|cite|table): (.*?) -->\s*$")
LABELS = re.compile(r"(over (?:the )?seeds)|(t interval|Student t)|(bootstrap|resampled)|(lowest low)", re.I)
KINDS = ("t", "t", "bootstrap", "range")


def _decimal(text: str) -> Decimal:
    return Decimal(text.replace("−", "-"))


def _equal(printed: str, value: str) -> bool:
    """Whether `value` rounds (half up) to `printed` at the decimals `printed` has."""
    figure = _decimal(printed)
    return _decimal(value).quantize(figure, ROUND_HALF_UP) == figure


def _kinds(text: str, prose: bool = False) -> list[str]:
    """The interval types a text names, in order; "over seeds" names the t interval in prose only."""
    found = [[g is not None for g in m.groups()].index(True) for m in LABELS.finditer(text)]
    return [KINDS[i] for i in found if prose or i > 0]


@dataclass
class Cell:
    """A source cell: its value, its numbers (a CSV cell's; a computed one's value, then each seed's), its intervals
    by type, multiple and p-value."""

    value: str
    numbers: list[str]
    intervals: dict[str, tuple[str, str]] = field(default_factory=dict)
    multiple: str | None = None
    p: str | None = None


def _csv_cell(text: str) -> Cell | None:
    numbers = [m.group(3) for m in TOKEN.finditer(text) if m.group(3)]
    return Cell(numbers[0], numbers) if numbers else None


def _computed_cell(value: figures_data.Value) -> Cell:
    """A computed figure at full precision: the document's rounding is the only one."""
    text = lambda x: None if x is None else repr(float(x))
    intervals = {kind: (repr(lo), repr(hi)) for kind, (lo, hi) in value.intervals.items()}
    numbers = [repr(x) for x in [value.value, *value.per_seed]]
    return Cell(numbers[0], numbers, intervals, text(value.multiple), text(value.p))


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _markdown_tables(path: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """A markdown file's tables as (title, header, rows), the title the heading above the table and the paragraph just
    above it, so that a caption tells apart the tables under one heading."""
    tables: list[tuple[str, list[list[str]]]] = []
    caption: list[str] = []
    heading = previous = ""
    for line in pathlib.Path(path).read_text().splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append((" ".join([heading, *caption]), []))
            tables[-1][1].append([c.replace("**", "") for c in _cells(line)])
        elif line.startswith("#"):
            heading, caption = line.lstrip("# "), []
        elif line.strip():
            caption = (caption if previous.strip() else []) + [line]
        previous = line
    return [(title, header, body) for title, (header, _, *body) in tables]


def _row_label(text: str) -> str:
    return re.sub(r" \(\d+ runs\)", "", text)


class Sources:
    """The CSVs and computed sources a document cites, each read once, and every cell looked up once."""

    def __init__(self) -> None:
        self.csvs: dict[str, tuple[list[str], list[list[str]]]] = {}
        self.markdown: dict[str, list[tuple[str, list[str], list[list[str]]]]] = {}
        self.found: dict[tuple, Cell | None] = {}

    def cell(self, address: "Address") -> Cell | None:
        """The cell at `address`; a LookupError names what is missing."""
        key = (address.source, address.table, address.row, address.col)
        if key not in self.found:
            if address.source in figures_data.SOURCES:
                self.found[key] = self._computed(address)
            else:
                self.found[key] = self._markdown(address) if address.source.endswith(".md") else self._csv(address)
        return self.found[key]

    def _computed(self, address: "Address") -> Cell:
        tables = [t for t in figures_data.tables(address.source) if address.table and address.table in t.title]
        if len(tables) != 1:
            raise LookupError(f"{len(tables)} tables {address.table!r} in {address.source}")
        table, row = tables[0], _row_label(address.row)
        if row not in table.rows or address.col not in table.columns:
            raise LookupError(f"no row {row!r} or column {address.col!r} in {address.source} {table.title!r}")
        return _computed_cell(table.compute(row, address.col))

    def _markdown(self, address: "Address") -> Cell | None:
        """The cell of a table a benchmark printed into a markdown file, picked by its title, row and column."""
        if address.source not in self.markdown:
            self.markdown[address.source] = _markdown_tables(address.source)
        name = pathlib.Path(address.source).name
        tables = [t for t in self.markdown[address.source] if address.table and address.table in t[0]]
        if len(tables) != 1:
            raise LookupError(f"{len(tables)} tables {address.table!r} in {name}")
        _, header, rows = tables[0]
        first = [c.strip() for c in address.row.split("|")]
        found = [r for r in rows if r[: len(first)] == first] or [r for r in rows if r[0].startswith(address.row)]
        if len(found) != 1 or address.col not in header:
            raise LookupError(f"{len(found)} rows {address.row!r}, or no column {address.col!r}, in {name}")
        return _csv_cell(found[0][header.index(address.col)])

    def _csv(self, address: "Address") -> Cell | None:
        if address.source not in self.csvs:
            with open(address.source) as f:
                header, *rows = list(csv.reader(f))
            self.csvs[address.source] = header, rows
        header, rows = self.csvs[address.source]
        pairs = [p.split("=", 1) for p in address.row.split(",")]
        if any(k not in header for k, _ in pairs) or address.col not in header:
            raise LookupError(f"no column {address.col!r} or {address.row!r} in {pathlib.Path(address.source).name}")
        found = [r for r in rows if all(r[header.index(k)] == v for k, v in pairs)]
        if len(found) != 1:
            raise LookupError(f"{len(found)} rows {address.row!r} in {pathlib.Path(address.source).name}")
        return _csv_cell(found[0][header.index(address.col)])


@dataclass
class Group:
    """A figure group of a document: a number (or an interval with none before it), its intervals, multiple and
    p-value."""

    start: int  # where in the text
    value: str | None = None
    where: str = ""  # document:line
    times: bool = False  # printed as a multiple: 1.30x
    intervals: list[tuple[str, str, str | None]] = field(default_factory=list)  # (lo, hi, type the document says)
    multiple: str | None = None
    p: str | None = None

    def __str__(self) -> str:
        parts = [f"{self.value}{'x' * self.times}"] if self.value else []
        parts += [f"[{lo}, {hi}]" for lo, hi, _ in self.intervals]
        return " ".join(parts + ([f"({self.multiple}x)"] if self.multiple else []) + ([f"p={self.p}"] if self.p else []))


def _groups(text: str, kinds: list[str] | None = None) -> list[Group]:
    """The figure groups of `text`; the i-th interval has type `kinds[i]`, or without `kinds` that of the label
    nearest to it in its sentence."""
    groups: list[Group] = []
    for m in TOKEN.finditer(text):
        if m.group(1):
            if not groups:
                groups.append(Group(m.start()))
            i = len(groups[-1].intervals)
            kind = _nearest_kind(text, m) if kinds is None else kinds[i] if i < len(kinds) else None
            groups[-1].intervals.append((m.group(1), m.group(2), kind))
        elif m.group(4) and groups and re.search(r"\]\s*\($", text[: m.start()]):
            groups[-1].multiple = m.group(3)
        elif re.search(r"\bp=$", text[: m.start()]):  # the p-value of the figure before it, or a figure alone
            if not groups or groups[-1].p:
                groups.append(Group(m.start()))
            groups[-1].p = m.group(3)
        else:
            times = bool(m.group(4) or re.match(rf"-{NUMBER}x", text[m.end() :]))  # 1.27 in 1.27-1.32x
            groups.append(Group(m.start(), value=m.group(3), times=times))
    return groups


def _nearest_kind(text: str, interval: re.Match) -> str | None:
    """The type named by the label nearest to `interval` within its sentence."""
    ends = [m.start() + 1 for m in re.finditer(r"\.\s", text)]
    start = max((e for e in ends if e <= interval.start()), default=0)
    end = min((e for e in ends if e >= interval.end()), default=len(text))
    distances = [
        (max(m.start() - interval.end(), interval.start() - m.end()), _kinds(m.group(0), prose=True)[0])
        for m in LABELS.finditer(text, start, end)
    ]
    return min(distances)[1] if distances else None


@dataclass
class Address:
    source: str  # a computed source's name, or a CSV's normalised path
    table: str
    row: str
    col: str
    index: int | None  # COL[n]: the cell's n-th number

    def __str__(self) -> str:
        name = pathlib.Path(self.source).name
        return f"{name}#{self.table}/{self.row}/{self.col}{f'[{self.index}]' if self.index else ''}"


def _source(name: str, base: pathlib.Path) -> str:
    """A computed source's name as it is, a CSV's path normalised."""
    return name if name in figures_data.SOURCES else os.path.normpath(base / name)


def _addresses(body: str, base: pathlib.Path, default: str) -> list[Address]:
    """The addresses of a marker's body, each omitted leading part carried over from the one before."""
    addresses, state = [], [default, "", "", ""]
    for entry in (e.strip() for e in body.split(";")):
        if "#" in entry:
            file, entry = entry.split("#", 1)
            state = [file, "", "", ""]
        parts = entry.split("/")
        state[len(state) - len(parts) :] = parts
        col, index = re.fullmatch(r"(.*?)(?:\[(\d+)\])?", state[3]).groups()  # type: ignore[union-attr]
        addresses.append(Address(_source(state[0], base), state[1], state[2], col, int(index) if index else None))
    return addresses


def _mismatches(group: Group, address: Address, sources: Sources) -> list[str]:
    """What in `group` differs from the cell at `address` (empty if nothing)."""
    try:
        cell = sources.cell(address)
    except LookupError as e:
        return [str(e)]
    if cell is None:
        return [f"{address} holds no number"]
    wrong = []
    if group.value is not None:
        if address.index:
            expected = cell.numbers[address.index - 1] if address.index <= len(cell.numbers) else "nothing"
        else:
            expected = cell.multiple if group.times and cell.multiple else cell.value
        if expected == "nothing" or not _equal(group.value, expected):
            wrong.append(f"{group.value} is {expected} there")
    for lo, hi, kind in group.intervals:
        found = cell.intervals.get(kind) if kind else None
        if kind is None:
            wrong.append(f"[{lo}, {hi}] names no interval type")
        elif found is None:
            wrong.append(f"[{lo}, {hi}] is labelled {kind}, and {address} has no {kind} interval")
        elif not (_equal(lo, found[0]) and _equal(hi, found[1])):
            wrong.append(f"{kind} [{lo}, {hi}] is [{found[0]}, {found[1]}] there")
    for name, printed, computed in (("x", group.multiple, cell.multiple), ("p", group.p, cell.p)):
        if printed and not (computed and _equal(printed, computed)):
            wrong.append(f"{printed} ({name}) is {computed} there")
    return wrong


@dataclass
class Block:
    """A paragraph (a list item is one) or a table of a document, the region it is in and the marker after it."""

    table: bool
    lines: list[tuple[int, str]]
    region: list[str] | None  # the region's files; None: not checked
    marker: tuple[str, str] | None = None


def _blocks(text: str, strict: bool) -> list[Block]:
    blocks: list[Block] = []
    region: list[str] | None = [] if strict else None
    current, in_code = None, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code, current = not in_code, None
        elif in_code:
            continue
        elif marker := MARKER.match(line):
            kind, body = marker.groups()
            if kind == "figures":
                region = None if body == "off" else body.split()
            elif blocks:
                blocks[-1].marker = (kind, body)
            current = None
        elif not line.strip():
            current = None
        else:
            table = line.startswith("|")
            if current is None or current.table != table or re.match(r"\s*[-*] ", line):
                current = Block(table, [], region)
                blocks.append(current)
            current.lines.append((number, re.sub(r"\]\([^)]*\)|`[^`]*`", "", line)))  # links and code are names
    return blocks


def _text_groups(block: Block, document: str) -> list[Group]:
    """The figure groups of a paragraph, each with its line."""
    text, starts = "", []
    for number, line in block.lines:
        starts.append((len(text), number))
        text += line.strip() + " "
    groups = _groups(text)
    for group in groups:
        group.where = f"{document}:{max(n for s, n in starts if s <= group.start)}"
    return groups


def _table_groups(block: Block, caption: str, document: str) -> list[tuple[list[Group], dict[str, str], int]]:
    """Per value cell of a table: its figure groups, what a template fills in ({1}, {2}, {h}) and which value column
    of its row it is; interval types from the caption and heading, in order."""
    header = _cells(block.lines[0][1])
    kinds = _kinds(f"{caption} {block.lines[0][1]}")
    cells: list[tuple[list[Group], dict[str, str], int]] = []
    for number, line in block.lines[2:]:
        row = _cells(line)
        fill = {"{1}": row[0], "{2}": row[1] if len(row) > 1 else ""}
        for col, text in zip(header, row):
            if groups := _groups(text, _kinds(text) or list(kinds)):  # a cell may name its own
                for group in groups:
                    group.where = f"{document}:{number}"
                cells.append((groups, fill | {"{h}": col}, sum(c[1]["{1}"] is row[0] for c in cells)))
    return cells


def _cited(block: Block, caption: str, document: str, base: pathlib.Path) -> list[tuple[Group, Address | None]]:
    """Each figure group of a block with the address its marker gives it (None: none)."""
    kind, body = block.marker or ("", "")
    default = block.region[0] if block.region else ""
    if not block.table:
        groups = _text_groups(block, document)
    else:
        cells = _table_groups(block, caption, document)
        if kind == "table":
            templates = [t.strip() for t in body.split(";")]
            pairs = []
            for groups, fill, column in cells:
                template = templates[min(column, len(templates) - 1)]
                for key, value in fill.items():
                    template = template.replace(key, value)
                address = _addresses(template, base, default)[0]
                pairs += [(g, address if len(groups) == 1 else None) for g in groups]
            return pairs
        groups = [g for gs, _, _ in cells for g in gs]
    addresses: list[Address | None] = list(_addresses(body, base, default)) if kind == "cite" else []
    if kind == "cite" and len(addresses) != len(groups):
        return [(g, None) for g in groups]  # reported below as uncited, with the counts
    return list(zip(groups, addresses or [None] * len(groups)))


def problems(text: str, document: str, base: pathlib.Path, strict: bool, sources: Sources | None = None) -> list[str]:
    """One line per figure of a document (`text`, its files relative to `base`) that does not equal the cell it cites
    or cites none; `strict`: figures before the first marker are errors."""
    sources, lines, caption = sources or Sources(), [], ""
    for block in _blocks(text, strict):
        if block.region is not None:
            allowed = {*(_source(f, base) for f in block.region), os.path.normpath(ROOT / "docs" / QUOTED)}
            for group, address in _cited(block, caption, document, base):
                if address is None:
                    lines.append(f"{group.where}: {group} cites no source" + _count(block))
                elif address.source not in allowed:
                    lines.append(f"{group.where}: {group} cites {address}, not a source of its region")
                else:
                    lines += [f"{group.where}: {group}: {w} ({address})" for w in _mismatches(group, address, sources)]
        caption = " ".join(line for _, line in block.lines) if not block.table else ""
    return lines


def _count(block: Block) -> str:
    if block.marker and block.marker[0] == "cite":
        return f" (its marker has {len(block.marker[1].split(';'))} addresses for a different number of figures)"
    return "" if block.region else " (no marker above it)"


def main() -> None:
    sources = Sources()
    found = [
        line
        for path, strict in DOCUMENTS.items()
        for line in problems((ROOT / path).read_text(), path, (ROOT / path).parent, strict, sources)
    ]
    print("\n".join(found) or f"every figure in {', '.join(DOCUMENTS)} equals its source, recomputed")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
