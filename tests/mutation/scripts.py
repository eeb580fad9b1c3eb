"""The curated mutants of scripts/ (the figures check)."""

from .common import Mutant

MUTANTS = [
    Mutant(
        "figures: results files joined whose loss was measured otherwise",
        "scripts/figures_data.py",
        "            results.check_alike(",
        "            (",
        ("tests/docs/test_figures.py", "-k", "several"),
    ),
    Mutant(
        "check_figures: a figure's value not compared with its cell",
        "scripts/check_figures.py",
        '        if expected == "nothing" or not _equal(group.value, expected):',
        '        if expected == "nothing":',
        ("tests/docs/test_figures.py::test_every_change_to_a_figure_of_the_real_documents_fails[figures]",),
    ),
    Mutant(
        "check_figures: an interval compared with its cell's interval of either type",
        "scripts/check_figures.py",
        "        found = cell.intervals.get(kind) if kind else None",
        "        found = next(iter(cell.intervals.values()), None) if kind else None",
        ("tests/docs/test_figures.py::test_the_results_and_the_readme_pass",),
    ),
    Mutant(
        "check_figures: a Holm p-value not compared with its computation",
        "scripts/check_figures.py",
        '    for name, printed, computed in (("x", group.multiple, cell.multiple), ("p", group.p, cell.p)):',
        '    for name, printed, computed in (("x", group.multiple, cell.multiple),):',
        ("tests/docs/test_figures.py::test_a_p_value_and_a_per_seed_figure_are_checked_against_the_computation",),
    ),
    Mutant(
        "figures_data: Holm's adjustment without its step-down factor",
        "scripts/figures_data.py",
        "        running = max(running, (len(p_values) - rank) * p_values[i])",
        "        running = max(running, p_values[i])",
        ("tests/docs/test_figures.py::test_holm_adjusts_the_kth_smallest_by_the_cells_left_and_keeps_the_order",),
    ),
]
