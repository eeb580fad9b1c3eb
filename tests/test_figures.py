"""Every measured figure in docs/results.md and the README is in the files it was read off (scripts/check_figures.py),
and the check finds a figure that is not."""

import pathlib

from scripts import check_figures

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_figure_in_the_results_and_the_readme_is_in_its_sources():
    assert [line for path, strict in check_figures.DOCUMENTS.items() for line in check_figures.unfound(ROOT / path, strict)] == []


def test_a_figure_that_is_not_in_its_sources_is_named(tmp_path):
    (tmp_path / "report.md").write_text("| lssar (3 runs) | -0.633 [-0.803, -0.411] (0.30x) |\n")
    (tmp_path / "loss.csv").write_text("variant,loss\nsoftmax,1.82401025\n")
    (tmp_path / "quoted.csv").write_text("figure,what,source\n0.04,LSSAR's rise as a multiple of softmax's,the LSSA paper\n")
    doc = tmp_path / "results.md"
    doc.write_text(
        "Before any marker: 1.234.\n"
        "<!-- figures: report.md loss.csv -->\n"
        "LSSAR: −0.633 [−0.80, −0.41], 0.30x softmax's rise (the paper: 0.04x); softmax 1.824 at 1x; 0.30-0.31x.\n"
        "```\nin code: 9.999\n```\n"
        "[a link](runs/v1.5/x.png) and `config 7.25` are names, not figures.\n"
        "Changed: −0.634 and 0.31x; CSV rounded otherwise: 1.825.\n"
        "<!-- figures: off -->\n"
        "Not checked: 5.55.\n"
    )
    found = lambda strict: [line.split(": ", 1)[1] for line in check_figures.unfound(doc, strict, tmp_path / "quoted.csv")]
    changed = ["0.31x is in none of its sources", "−0.634 is in none of its sources", "0.31x is in none of its sources"]
    assert found(True) == ["1.234 has no source (no marker above it)", *changed, "1.825 is in none of its sources"]
    assert found(False) == [*changed, "1.825 is in none of its sources"]  # the README: only under markers
