"""Every measured figure in docs/results.md, the README and the docs pages it links to equals its source recomputed
from the committed data (scripts/check_figures.py, scripts/figures_data.py), and the check fails on each figure of the
real documents changed as a referee would change it: a last digit, a sign, an interval's type label, a figure with no
source."""

import dataclasses
import pathlib
import random
import re

import numpy as np
import pytest
from scipy import stats as scipy_stats

from freeatten_jax.errors import UserError
from scripts import check_figures as cf
from scripts import figures_data as fd

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = cf.Sources()
SWAPPED = {"t": "bootstrap", "bootstrap": "t interval", "range": "bootstrap"}


def _problems(path: str, text: str) -> list[str]:
    return cf.problems(text, path, (ROOT / path).parent, cf.DOCUMENTS[path], SOURCES)


def _checked_lines(text: str, strict: bool) -> list[int]:
    """The (0-based) lines the check reads figures on."""
    return [n - 1 for block in cf._blocks(text, strict) if block.region is not None for n, _ in block.lines]


def _names(line: str) -> list[tuple[int, int]]:
    """The spans of a line's link targets and code, whose numbers are names."""
    return [m.span() for m in re.finditer(r"\]\([^)]*\)|`[^`]*`", line)]


def _figures(line: str) -> list[tuple[int, int]]:
    """The spans of a line's figures (each end of an interval is one)."""
    spans = [s for m in cf.TOKEN.finditer(line) for s in ([m.span(1), m.span(2)] if m.group(1) else [m.span(3)])]
    return [s for s in spans if not any(a <= s[0] < b for a, b in _names(line))]


def _last_digit(figure: str) -> str:
    return figure[:-1] + str((int(figure[-1]) + 1) % 10)


def _sign(figure: str) -> str:
    return {"+": "−", "−": "+", "-": "+"}.get(figure[0], "") + figure.lstrip("+−-") if figure[0] in "+−-" else "−" + figure


def _mutants(path: str) -> list[tuple[str, str]]:
    """(what, the document with it) for every figure's last digit and sign; a zero's sign changes nothing."""
    text = (ROOT / path).read_text()
    lines = text.splitlines()
    mutants = []
    for n in _checked_lines(text, cf.DOCUMENTS[path]):
        for a, b in _figures(lines[n]):
            figure = lines[n][a:b]
            changes = [_last_digit] + ([_sign] if float(figure.replace("−", "-")) != 0 else [])
            for change in changes:
                line = lines[n][:a] + change(figure) + lines[n][b:]
                mutants.append((f"{path}:{n + 1}: {figure} -> {change(figure)}", "\n".join(lines[:n] + [line] + lines[n + 1 :])))
    return mutants


def _kinds(path: str, text: str) -> list[str | None]:
    """The type the check gives each interval of a document."""
    kinds, caption = [], ""
    for block in cf._blocks(text, cf.DOCUMENTS[path]):
        if block.region is not None:
            kinds += [k for group, _ in cf._cited(block, caption, path, ROOT) for _, _, k in group.intervals]
        caption = " ".join(line for _, line in block.lines) if not block.table else ""
    return kinds


def _label_swaps(path: str) -> list[tuple[str, str]]:
    """(what, the document with it) for every type label that types an interval, swapped for the other type."""
    text = (ROOT / path).read_text()
    lines, before = text.splitlines(), _kinds(path, text)
    mutants = []
    for n in _checked_lines(text, cf.DOCUMENTS[path]):
        for m in cf.LABELS.finditer(lines[n]):
            swapped = SWAPPED[cf._kinds(m.group(0), prose=True)[0]]
            line = lines[n][: m.start()] + swapped + lines[n][m.end() :]
            mutated = "\n".join(lines[:n] + [line] + lines[n + 1 :])
            if _kinds(path, mutated) != before:  # else the label types no interval
                mutants.append((f"{path}:{n + 1}: {m.group(0)!r} -> {swapped!r}", mutated))
    return mutants


def _unsourced(path: str) -> list[tuple[str, str]]:
    """(what, the document with it) for every cite and table marker removed."""
    lines = (ROOT / path).read_text().splitlines()
    return [
        (f"{path}:{n + 1}: marker removed", "\n".join(lines[:n] + lines[n + 1 :]))
        for n, line in enumerate(lines)
        if re.match(r"<!-- (cite|table): ", line)
    ]


def test_the_results_and_the_readme_pass():
    assert [line for path in cf.DOCUMENTS for line in _problems(path, (ROOT / path).read_text())] == []


@pytest.mark.parametrize("kind", ["figures", "labels", "sources"])
def test_every_change_to_a_figure_of_the_real_documents_fails(kind):
    make = {"figures": _mutants, "labels": _label_swaps, "sources": _unsourced}[kind]
    mutants = [m for path in cf.DOCUMENTS for m in make(path)]
    assert len(mutants) > {"figures": 2000, "labels": 30, "sources": 40}[kind]
    tried = random.Random(0).sample(mutants, min(len(mutants), 500))  # each check re-reads a document: ~30 ms
    missed = [what for what, text in tried if not _problems(what.split(":")[0], text)]
    print(f"{kind}: {len(tried) - len(missed)} of {len(tried)} changes detected ({len(mutants)} possible)")
    assert missed == []


def test_a_figure_with_no_source_fails():
    text = (ROOT / "docs/results.md").read_text()
    added = text.replace("What the tables say:\n", "What the tables say (softmax's rise at 16x is +0.910):\n")
    line = text.splitlines().index("What the tables say:") + 1
    assert _problems("docs/results.md", added) == [f"docs/results.md:{line}: +0.910 cites no source"]


RESULTS = """## A run

Machine: the CPU.

| T | variant | fwd x base | x base |
|---|---|---|---|
| 2048 | lssa | 3.09 | **3.41** |
| 2048 | lssar | 2.29 | 3.65 / 3.60 |

**Timed, T = 8192**:

| row | fwd+bwd ms |
|---|---|
| lssa, pallas | 6.099 |
| lssa, pallas, split_matmuls | 6.615 |
"""


# equal (bold ignored, a cell's second number, a caption picking the table, a row by its first cell's start); a digit,
# the n-th number and the column changed; a title and a row that pick two
@pytest.mark.parametrize(
    "figures, cite, found",
    [
        (
            "3.41x, 3.60, 6.10 -> 6.62",
            "Machine/2048 | lssa/x base; 2048 | lssar/x base[2]; Timed/lssa, pallas/fwd+bwd ms; lssa, pallas, split/fwd+bwd ms",
            [],
        ),
        ("3.42x", "Machine/2048 | lssa/x base", ["3.42x: 3.42 is 3.41 there (RESULTS.md#Machine/2048 | lssa/x base)"]),
        ("3.65", "Machine/2048 | lssar/x base[2]", ["3.65: 3.65 is 3.60 there (RESULTS.md#Machine/2048 | lssar/x base[2])"]),
        ("3.41", "Machine/2048 | lssa/fwd x base", ["3.41: 3.41 is 3.09 there (RESULTS.md#Machine/2048 | lssa/fwd x base)"]),
        ("3.41", "A run/2048 | lssa/x base", ["3.41: 2 tables 'A run' in RESULTS.md (RESULTS.md#A run/2048 | lssa/x base)"]),
        (
            "3.41",
            "Machine/2048/x base",
            ["3.41: 2 rows '2048', or no column 'x base', in RESULTS.md (RESULTS.md#Machine/2048/x base)"],
        ),
    ],
)
def test_a_markdown_table_figure_is_checked_at_the_cell_its_title_row_and_column_pick(tmp_path, figures, cite, found):
    (tmp_path / "RESULTS.md").write_text(RESULTS)
    text = f"<!-- figures: RESULTS.md -->\nLSSA {figures}.\n<!-- cite: RESULTS.md#{cite} -->\n"
    assert [line.split(": ", 1)[1] for line in cf.problems(text, "doc.md", tmp_path, False)] == found


def test_a_kernels_page_figure_from_benchmarks_results_fails_when_changed():
    text = (ROOT / "docs/kernels.md").read_text()
    wrong = text.replace("LSSAR 10.78 (0.23x)", "LSSAR 10.79 (0.23x)")
    assert wrong != text and [line.split(": ", 1)[1] for line in _problems("docs/kernels.md", wrong)] == [
        "10.79: 10.79 is 10.78 there (RESULTS.md#Timed, T = 8192/lssar, pallas/fwd+bwd ms)"
    ]


def test_holm_adjusts_the_kth_smallest_by_the_cells_left_and_keeps_the_order():
    # sorted 0.01, 0.03, 0.04: 3 * 0.01, 2 * 0.03, then max(0.06, 1 * 0.04); 0.5 * 4 is capped at 1
    assert fd.holm([0.04, 0.01, 0.03]) == pytest.approx([0.06, 0.03, 0.06])
    assert fd.holm([0.5, 0.01, 0.2, 0.3]) == pytest.approx([0.6, 0.04, 0.6, 0.6])
    assert fd.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_the_p_value_is_the_one_sample_t_test_its_t_interval_inverts():
    per_seed = np.array([-0.69, -0.80, -0.41])
    assert fd.t_p_value(per_seed) == pytest.approx(scipy_stats.ttest_1samp(per_seed, 0.0).pvalue)
    assert (fd.t_p_value(np.zeros(3)), fd.t_p_value(np.full(3, 0.25))) == (1.0, 0.0)  # every seed alike


def test_the_seeds_a_contrast_needs_are_the_fewest_whose_t_interval_is_narrower_than_the_target():
    assert fd.t_width(0.5, 3) == pytest.approx(2 * 4.302653 * 0.5 / np.sqrt(3))  # t(0.975, 2) = 4.302653
    assert fd.t_width(0.5, 1) == np.inf
    for sd, width in ((0.206, 0.139), (0.03, 0.53), (1.0, 0.5)):
        seeds = fd.seeds_for_width(sd, width)
        assert fd.t_width(sd, seeds) < width <= fd.t_width(sd, seeds - 1) and seeds >= 2
    assert fd.seeds_for_width(0.03, 0.53) == 3 and fd.seeds_for_width(1.0, 0.5) == 64  # 2 * 1.998 / sqrt(64) = 0.4996
    with pytest.raises(ValueError, match="no number of seeds"):
        fd.seeds_for_width(0.1, -0.2)


def test_a_p_value_and_a_per_seed_figure_are_checked_against_the_computation():
    text = (ROOT / "docs/results.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| lssa | end |") and "p=" in line)
    p = re.search(r"p=(\d\.\d+)", row).group(1)  # type: ignore[union-attr]
    wrong = text.replace(row, row.replace(f"p={p}", f"p={_last_digit(p)}", 1))
    assert [line for line in _problems("docs/results.md", wrong) if "(p) is" in line]


def test_runs_of_several_files_join_only_when_their_loss_was_measured_alike(tmp_path):
    text = fd.DATA / "results.json.gz"
    runs, settings = fd.results.read(text)
    lssar = [dataclasses.replace(r, name=f"lssar-seed{r.seed + 3}", seed=r.seed + 3) for r in runs if r.variant == "lssar"]
    later = tmp_path / "results.json"
    fd.results.write(later, lssar, {**settings, "passkey_keys": 1})  # retrieval measured otherwise: the loss compares
    assert sorted(r.seed for r in fd.Runs(text, later).group("lssar")) == [0, 1, 2, 3, 4, 5]
    fd.results.write(later, lssar, {**settings, "eval_tokens": settings["eval_tokens"] // 2})
    with pytest.raises(UserError, match=re.escape(f"{later}: measured with eval_tokens=32800, this evaluation with 65600")):
        fd.Runs(text, later)
