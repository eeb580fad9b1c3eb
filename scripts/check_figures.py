"""Re-checks every measured figure in docs/results.md and the README against the exact source cell it cites.

A figure that is only "somewhere in the sources" passes a changed digit that happens to be elsewhere in them, so
each figure is tied to one cell: a cell of a table in a report (`results/report.md`), or of a CSV. Markers:

    <!-- figures: results/report.md results/mqar.md -->   a region: its figures are checked, and may cite these files
    <!-- figures: off -->                                  a region of setups and benchmarks: not checked
    <!-- cite: ADDRESS; ADDRESS; ... -->                   the paragraph or table just above: one address per figure
    <!-- table: TEMPLATE; TEMPLATE; ... -->                the table just above: one address template per column

An address is `FILE#TABLE/ROW/COL`. FILE is relative to the document (default: the region's first file); TABLE is
part of a report table's title (its `##` heading and the line above the table; every table whose title holds it),
ROW a row's label, its first cells joined by a space and without "(3 runs)", COL a column's heading (or its
start). A CSV has no TABLE, and its ROW is `column=value,...` naming one row. Omitted leading parts carry over
from the previous address in the marker, so `16x` after `Rise minus/lssar/8x` is `Rise minus/lssar/16x`; `COL[n]` is
the cell's n-th number.
In a table template `{1}`, `{2}` are the row's first and second cells and `{h}` the column's heading; the last template
serves the remaining columns.

A figure group is a number, the intervals after it ([lo, hi]) and a multiple right after those ((0.30x)); it
must equal its cell at the decimals printed: the number the cell's value (or its multiple, for `1.30x`), each
interval the cell's interval of the type the document states. Report tables say their type in their title:
"t interval" or "Student t" (t), "bootstrap" or "resampled" (bootstrap), "lowest low" (range). The document says it
in a table's caption and heading, in order, one per bracket of a cell (unless the cell names its own); in prose by
the nearest of "over seeds" (t), "bootstrap" or "lowest low" in the same sentence. Figures quoted from the papers and
the method's constants
cite docs/results/quoted.csv (`quoted.csv#figure=0.89/figure`). Every figure in a checked region must be cited; in
docs/results.md that is every figure after the first marker (before it, an error), in the README only those in
regions. Integers, percentages, times, links and code are not figures.

    python scripts/check_figures.py            # one line per figure that does not match; exit 1 if any
"""

import csv
import os
import pathlib
import re
import sys
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCUMENTS = {"docs/results.md": True, "README.md": False}  # path: whether text before the first marker is checked
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
    """A source cell: its value, its intervals by type and its multiple (the `(0.30x)` after them)."""

    value: str
    numbers: list[str]
    intervals: dict[str, tuple[str, str]] = field(default_factory=dict)
    multiple: str | None = None


def _cell(text: str, kind: str | None) -> Cell | None:
    tokens = list(TOKEN.finditer(text))
    if not tokens:
        return None
    numbers = [n for m in tokens for n in (m.group(1, 2) if m.group(1) else [m.group(3)])]
    cell = Cell(numbers[0], numbers)
    for m in tokens[1:]:
        if m.group(1) and kind:
            cell.intervals[kind] = (m.group(1), m.group(2))
        elif m.group(4):
            cell.multiple = m.group(3)
    return cell


@dataclass
class Table:
    title: str
    kind: str | None
    header: list[str]
    rows: list[list[str]]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _row_label(cells: list[str], n: int) -> str:
    return re.sub(r" \(\d+ runs\)", "", " ".join(cells[:n]))


def _report_tables(text: str) -> list[Table]:
    """The tables of a markdown report, each titled by its `##` heading and the line above it."""
    tables, heading, above, lines = [], "", "", text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("## "):
            heading = line
        elif line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            title = f"{heading} / {above}"
            kinds = _kinds(title)
            tables.append(Table(title, kinds[0] if kinds else None, _cells(line), []))
        elif line.startswith("|") and not line.startswith("|---") and tables:
            tables[-1].rows.append(_cells(line))
        if line.strip() and not line.startswith("|"):
            above = line
    return tables


def _csv_table(path: pathlib.Path) -> Table:
    with path.open() as f:
        header, *rows = list(csv.reader(f))
    return Table(path.name, None, header, rows)


class Sources:
    """The tables of the files a document cites, read once each."""

    def __init__(self) -> None:
        self.files: dict[pathlib.Path, list[Table]] = {}
        self.found: dict[tuple, list[tuple[Table, str]]] = {}  # what cells() found, by its arguments

    def tables(self, path: pathlib.Path) -> list[Table]:
        if path not in self.files:
            text = path.read_text()
            self.files[path] = [_csv_table(path)] if path.suffix == ".csv" else _report_tables(text)
        return self.files[path]

    def cells(self, path: pathlib.Path, table: str, row: str, col: str) -> list[tuple[Table, str]]:
        """The cell at (row, col) of every table of `path` whose title holds `table`; an error names what is missing."""
        key = (path, table, row, col)
        if key not in self.found:
            self.found[key] = self._cells(path, table, row, col)
        return self.found[key]

    def _cells(self, path: pathlib.Path, table: str, row: str, col: str) -> list[tuple[Table, str]]:
        tables = [t for t in self.tables(path) if path.suffix == ".csv" or table in t.title]
        if not tables:
            raise LookupError(f"no table {table!r} in {path.name}")
        found = []
        for t in tables:
            cols = [c for c in t.header if c == col] or [c for c in t.header if c.startswith(col)]
            rows = [r for r in t.rows if _matches(t, r, row)]
            if len(cols) != 1 or len(rows) != 1:
                raise LookupError(f"{len(rows)} rows {row!r}, {len(cols)} columns {col!r} in {path.name} {t.title!r}")
            found.append((t, rows[0][t.header.index(cols[0])]))
        return found


def _matches(table: Table, cells: list[str], row: str) -> bool:
    if table.title.endswith(".csv"):  # its row: column=value,...
        return all(cells[table.header.index(k)] == v for k, v in (p.split("=", 1) for p in row.split(",")))
    return any(_row_label(cells, n) == _row_label([row], 1) for n in (1, 2))


@dataclass
class Group:
    """A figure group of a document: a number (or an interval with none before it), its intervals and multiple."""

    start: int  # where in the text
    value: str | None = None
    where: str = ""  # document:line
    times: bool = False  # printed as a multiple: 1.30x
    intervals: list[tuple[str, str, str | None]] = field(default_factory=list)  # (lo, hi, type the document says)
    multiple: str | None = None

    def __str__(self) -> str:
        parts = [f"{self.value}{'x' * self.times}"] if self.value else []
        parts += [f"[{lo}, {hi}]" for lo, hi, _ in self.intervals]
        return " ".join(parts + ([f"({self.multiple}x)"] if self.multiple else []))


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
        else:
            times = bool(m.group(4) or re.match(rf"-{NUMBER}x", text[m.end() :]))  # 1.27 in 1.27-1.32x
            groups.append(Group(m.start(), m.group(3), times=times))
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
    path: pathlib.Path
    table: str
    row: str
    col: str
    index: int | None  # COL[n]: the cell's n-th number

    def __str__(self) -> str:
        return f"{self.path.name}#{self.table}/{self.row}/{self.col}{f'[{self.index}]' if self.index else ''}"


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
        addresses.append(Address(base / state[0], state[1], state[2], col, int(index) if index else None))
    return addresses


def _mismatches(group: Group, address: Address, sources: Sources) -> list[str]:
    """What in `group` differs from the cell at `address` (empty if nothing)."""
    try:
        cells = [(t, _cell(text, t.kind)) for t, text in sources.cells(address.path, address.table, address.row, address.col)]
    except LookupError as e:
        return [str(e)]
    if any(c is None for _, c in cells):
        return [f"{address} holds no number"]
    first = cells[0][1]
    assert first is not None
    wrong = []
    if group.value is not None:
        if address.index:
            expected = first.numbers[address.index - 1] if address.index <= len(first.numbers) else "nothing"
        else:
            expected = first.multiple if group.times and first.multiple else first.value
        if expected == "nothing" or not _equal(group.value, expected):
            wrong.append(f"{group.value} is {expected} there")
    for lo, hi, kind in group.intervals:
        found = [c.intervals[kind] for _, c in cells if c and kind in c.intervals]
        if kind is None:
            wrong.append(f"[{lo}, {hi}] names no interval type")
        elif not found:
            wrong.append(f"[{lo}, {hi}] is labelled {kind}, and {address} has no {kind} interval")
        elif not (_equal(lo, found[0][0]) and _equal(hi, found[0][1])):
            wrong.append(f"{kind} [{lo}, {hi}] is [{found[0][0]}, {found[0][1]}] there")
    if group.multiple and not (first.multiple and _equal(group.multiple, first.multiple)):
        wrong.append(f"({group.multiple}x) is {first.multiple}x there")
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
            allowed = {os.path.normpath(p) for p in [*(base / f for f in block.region), ROOT / "docs" / QUOTED]}
            for group, address in _cited(block, caption, document, base):
                if address is None:
                    lines.append(f"{group.where}: {group} cites no source" + _count(block))
                elif os.path.normpath(address.path) not in allowed:
                    lines.append(f"{group.where}: {group} cites {address.path.name}, not a source of its region")
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
    print("\n".join(found) or f"every figure in {', '.join(DOCUMENTS)} equals the source cell it cites")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
