"""The named computations that docs/results.md and the README cite (scripts/check_figures.py): each recomputes its
figures from the committed data in docs/results/ (the suite's results.json.gz files; `make demo`'s in docs/demo/), so
a figure is checked against the data itself, not against a report printed from it.

A source (`text`, `switch`, `contrast`, `switch_control`, `mqar`, `mqar_dilute`, `demo`, `ruler`) is a list of tables; a table's
cell is computed when first asked for. Every paired contrast carries its hierarchical bootstrap interval, its Student t
interval over seeds and, where its table is a family of tests (docs/method.md §7), its Holm-adjusted p-value over that
family.
"Extrapolates better" is scored one way for loss and accuracy: the change from 1x that worsens it (loss: the rise;
accuracy: the drop) minus softmax's.

    python -m scripts.figures_data mqar "drop minus" t   # a computed table's rows, as the pages print them

Glossary: R runs (seeds), W windows (or MQAR instances).
"""

import functools
import pathlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as scipy_stats

from freeatten_jax.data import mqar
from freeatten_jax.evaluation import mqar_report, paired, plots, report, results, ruler_report, stats
from freeatten_jax.evaluation.results import RunResult
from freeatten_jax.evaluation.settings import Settings

DATA = pathlib.Path(__file__).resolve().parent.parent / "docs" / "results"
BASELINE = ("softmax", "none")
MULTIPLIERS = (1, 2, 4, 8, 16)
# the direct contrasts the claims rest on: (variant, switch) minus (variant, switch), both paired by seed and window
DIRECT = {
    "text": [(("lssar_fixed", "none"), ("lssar", "none")), (("lssa_fixed", "none"), ("lssa", "none"))],
    "switch": [
        (("ssmax from softmax@450 +150", "none"), ("ssmax", "none")),
        (("ssmax from softmax@600 +150", "none"), ("ssmax", "none")),
        (("lssar from lssa@600 +150", "none"), ("lssar", "none")),
    ],
}


@dataclass
class Value:
    """One computed figure: its value, its intervals by type ("t", "bootstrap", "range"), the rise as a multiple of
    softmax's, its Holm-adjusted p-value, and a contrast's value per seed."""

    value: float
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    multiple: float | None = None
    p: float | None = None
    per_seed: list[float] = field(default_factory=list)


@dataclass
class Table:
    """A computed table: `compute(row, column)` gives a cell; `family` names the cells one Holm correction covers
    (None: not a test)."""

    title: str
    rows: list[str]
    columns: list[str]
    compute: Callable[[str, str], Value]
    family: Callable[[str], str | None] = lambda column: None


def _x(multiplier: int) -> str:
    return f"{multiplier}x"


def _multiplier(column: str) -> int:
    return int(column.rstrip("x"))


def t_p_value(per_seed_R: np.ndarray) -> float:
    """Two-sided one-sample t test of the per-seed differences against 0 (df = seeds - 1)."""
    per_seed_R = np.asarray(per_seed_R, np.float64)
    if len(per_seed_R) < 2:  # one seed (`make demo`): no test
        return float("nan")
    scale, mean = np.std(per_seed_R, ddof=1) / np.sqrt(len(per_seed_R)), abs(per_seed_R.mean())
    if scale == 0:  # every seed the same: no doubt about the sign, or nothing to test
        return 0.0 if mean else 1.0
    return float(2 * scipy_stats.t.sf(mean / scale, len(per_seed_R) - 1))


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order: the k-th smallest times (m - k + 1), made monotone,
    capped at 1."""
    order = np.argsort(p_values, kind="stable")
    adjusted, running = np.empty(len(p_values)), 0.0
    for rank, i in enumerate(order):
        running = max(running, (len(p_values) - rank) * p_values[i])
        adjusted[i] = min(running, 1.0)
    return [float(a) for a in adjusted]


# the columns of "Seeds for the direct contrast": the per-seed differences' standard deviation at 16x (the seeds run so
# far), half the adaptive twin's rise at 16x (the width to get below), the seeds needed, and the t interval's width
# at that many seeds and at one fewer (the sd taken as known)
SEEDS_NEEDED = ("sd", "target", "seeds", "width", "width, one fewer")


def t_width(sd: float, seeds: int) -> float:
    """The width of a 95% Student t interval over `seeds` values of standard deviation `sd` (df = seeds - 1)."""
    return float(2 * scipy_stats.t.ppf(0.975, seeds - 1) * sd / np.sqrt(seeds)) if seeds > 1 else float("inf")


def seeds_for_width(sd: float, width: float) -> int:
    """The fewest seeds (2 or more) whose t interval, at standard deviation `sd`, is narrower than `width`."""
    if not width > 0:
        raise ValueError(f"no number of seeds gives a t interval narrower than {width}")
    seeds = 2
    while t_width(sd, seeds) >= width:
        seeds += 1
    return seeds


def _contrast(terms: list[tuple[float, np.ndarray]]) -> Value:
    """A paired contrast with both intervals and its unadjusted p-value (adjusted by its table's family later)."""
    boot, seed = stats.contrast(terms), stats.seed_level(terms)
    intervals = {"bootstrap": boot["ci"], "t": seed["ci"]}
    return Value(seed["difference"], intervals, p=t_p_value(seed["per_seed"]), per_seed=seed["per_seed"])


def _with_holm(tables: list[Table]) -> list[Table]:
    """The tables with each cell's p-value Holm-adjusted over its family: every cell, of any of these tables, whose
    column its table puts in a family of that name (the MQAR placements share theirs)."""
    raw = {t.title: functools.cache(t.compute) for t in tables}

    @functools.cache
    def adjusted(family: str) -> dict[tuple[str, str, str], float]:
        cells = [(t.title, r, c) for t in tables for r in t.rows for c in t.columns if t.family(c) == family]
        return dict(zip(cells, holm([raw[t](r, c).p for t, r, c in cells])))  # type: ignore[misc]

    def adjust(table: Table) -> Table:
        def compute(row: str, column: str) -> Value:
            value, family = raw[table.title](row, column), table.family(column)
            p = None if family is None else adjusted(family)[table.title, row, column]
            return Value(value.value, value.intervals, value.multiple, p, value.per_seed)

        return Table(table.title, table.rows, table.columns, compute, table.family)

    return [adjust(t) for t in tables]


LOSS_SETTINGS = ("multipliers", "eval_tokens", "span_windows")  # what shapes the loss by length; retrieval may differ


class Runs:
    """The runs of results.json.gz files by group, with each group's per-window values on the seeds softmax shares.
    Several files must have measured the loss alike (LOSS_SETTINGS): their loss tables then compare."""

    def __init__(self, path: pathlib.Path, *more: pathlib.Path) -> None:
        runs, first = results.read(path)
        for other in more:
            theirs, their = results.read(other)
            results.check_alike(str(other), their, first, LOSS_SETTINGS, f"its loss does not compare with {path}'s", Settings)
            runs += theirs
        self.groups = plots.groups(runs)
        self.names = {plots.group_name(*g, 1): g for g in self.groups}  # named without "(3 runs)"

    def group(self, row: str) -> list[RunResult]:
        return self.groups[self.names[row]]

    def seeds(self, *groups: list[RunResult]) -> list[int]:
        return sorted(set.intersection(*({r.seed for r in rs} for rs in groups)))


def _loss_tables(runs: Runs, direct: list) -> list[Table]:
    """Loss by length, the rise from 1x, the loss and the rise minus softmax's, and the direct contrasts."""
    base, rows = runs.groups[BASELINE], list(runs.names)
    others = [n for n in rows if runs.names[n] != BASELINE]
    longer = [_x(m) for m in MULTIPLIERS[1:]]

    def windows(row: str, against: list[RunResult], column: str) -> np.ndarray:
        rs = runs.group(row)
        return paired.per_window(rs, runs.seeds(rs, against), _multiplier(column))

    def loss(row: str, column: str) -> Value:
        xs = [r.at(_multiplier(column)) for r in runs.group(row)]
        low, high = min(x.loss_ci[0] for x in xs), max(x.loss_ci[1] for x in xs)
        one = {"bootstrap": xs[0].loss_ci} if len(xs) == 1 else {}  # one run: its own bootstrap interval over windows
        return Value(float(np.mean([x.loss for x in xs])), {"range": (low, high), **one})

    def rise(row: str, column: str) -> Value:
        rs = runs.group(row)
        return _contrast([(1, windows(row, rs, column)), (-1, windows(row, rs, "1x"))])

    def diff(row: str, column: str) -> np.ndarray:
        return windows(row, base, column) - paired.per_window(base, runs.seeds(runs.group(row), base), _multiplier(column))

    def loss_minus(row: str, column: str) -> Value:
        return _contrast([(1, diff(row, column))])

    def rise_minus(row: str, column: str) -> Value:
        value = _contrast([(1, diff(row, column)), (-1, diff(row, "1x"))])
        own = windows(row, base, column).mean() - windows(row, base, "1x").mean()
        value.multiple = float(own / (own - value.value))  # the rise as a multiple of softmax's on the same seeds
        return value

    pairs = {f"{a[0]} minus {b[0]}": (a, b) for a, b in direct if a in runs.groups and b in runs.groups}

    def direct_rise(row: str, column: str) -> Value:
        a, b = (runs.groups[g] for g in pairs[row])
        seeds, m = runs.seeds(a, b), _multiplier(column)
        d = {k: paired.per_window(a, seeds, k) - paired.per_window(b, seeds, k) for k in (1, m)}
        return _contrast([(1, d[m]), (-1, d[1])])

    def seeds_needed(row: str, column: str) -> Value:
        """How many seeds the direct contrast at the longest length needs for its t interval to be narrower than half
        the adaptive twin's own rise there (`column`: which of these figures)."""
        longest = _x(MULTIPLIERS[-1])
        sd = float(np.std(direct_rise(row, longest).per_seed, ddof=1))
        target = rise(plots.group_name(*pairs[row][1], 1), longest).value / 2
        seeds = seeds_for_width(sd, target)
        figures = {
            "sd": sd,
            "target": target,
            "seeds": seeds,
            "width": t_width(sd, seeds),
            "width, one fewer": t_width(sd, seeds - 1),
        }
        return Value(float(figures[column]))

    at_1x = lambda column: "loss at 1x" if column == "1x" else "loss beyond 1x"
    return _with_holm(
        [
            Table("Loss over all positions", rows, [_x(m) for m in MULTIPLIERS], loss),
            Table("Rise from 1x", rows, longer, rise),
            Table("Loss minus", others, [_x(m) for m in MULTIPLIERS], loss_minus, at_1x),
            Table("Rise minus", others, longer, rise_minus, lambda c: "rise"),
            Table("Rise, direct", list(pairs), longer, direct_rise, lambda c: "direct"),
            Table("Seeds for the direct contrast", list(pairs), list(SEEDS_NEEDED), seeds_needed),
        ]
    )


def _run_tables(runs: Runs) -> list[Table]:
    """Per group: the learned SSMax s by layer, attention entropy by visible keys, the true key's mean rank."""
    with_s = [n for n in runs.names if runs.group(n)[0].ssmax_s is not None]
    layers = len(runs.group(with_s[0])[0].ssmax_s or []) if with_s else 0
    n_from = next(iter(runs.groups.values()))[0].attention.n_from  # type: ignore[union-attr]
    tasks = {f"{n} {task}": (n, task) for n in runs.names for task in ("passkey", "retrieval")}

    def learned_s(row: str, column: str) -> Value:
        s_RLH = np.asarray([r.ssmax_s for r in runs.group(row)])
        return Value(float(s_RLH[:, int(column.split()[1])].mean()))

    def entropy(row: str, column: str) -> Value:
        u = report.n_bins(n_from).index(column)
        return Value(float(np.mean([np.asarray(r.attention.entropy)[:, :, u].mean() for r in runs.group(row)])))  # type: ignore[union-attr]

    def key_rank(row: str, column: str) -> Value:
        name, task = tasks[row]
        cells = [c for r in runs.group(name) for c in getattr(r, task) if c.mean_key_rank is not None]
        return Value(sum(c.mean_key_rank * c.keys for c in cells) / sum(c.keys for c in cells))

    return [
        Table("Learned SSMax s, mean", with_s, [f"layer {i}" for i in range(layers)], learned_s),
        Table("Entropy by N_i", list(runs.names), report.n_bins(n_from), entropy),
        Table("Key rank", list(tasks), ["mean rank"], key_rank),
    ]


def _mqar_tables(runs: Runs) -> list[Table]:
    """Per placement measured: accuracy (all and first-time queries), minus softmax's, the drop from 1x and that drop
    minus softmax's; per variant start minus end (what reaching further back costs at the same N_i) and dilute
    minus end (what competing keys cost); and, with eval-time switches, each switch's accuracy minus the same runs'
    as trained, per placement (one family). Dilution is a question of its own: its cells are families of their own, so
    that measuring it leaves start's and end's p-values as they were."""
    base, rows = runs.groups[BASELINE], list(runs.names)
    measured = {x.placement for rs in runs.groups.values() for r in rs for x in r.mqar}
    placements = [p for p in mqar.PLACEMENTS if p in measured]
    question = lambda placement: "" if placement in ("start", "end") else f", {placement}"
    others = [n for n in rows if runs.names[n] != BASELINE]
    columns, longer = [_x(m) for m in MULTIPLIERS], [_x(m) for m in MULTIPLIERS[1:]]

    def instances(rs: list[RunResult], seeds: list[int], column: str, placement: str, first: bool = False) -> np.ndarray:
        picked = [r for r in rs if r.seed in seeds]
        return mqar_report.per_instance(picked, _multiplier(column), placement, first)

    def own(row: str, column: str, placement: str) -> np.ndarray:
        rs = runs.group(row)
        return instances(rs, runs.seeds(rs), column, placement)

    def diff(row: str, column: str, placement: str) -> np.ndarray:
        seeds = runs.seeds(runs.group(row), base)
        return instances(runs.group(row), seeds, column, placement) - instances(base, seeds, column, placement)

    def accuracy(placement: str, first: bool) -> Callable[[str, str], Value]:
        def compute(row: str, column: str) -> Value:
            rs = runs.group(row)
            summary = stats.mean_with_interval(instances(rs, runs.seeds(rs), column, placement, first))
            return Value(summary["mean"], {"bootstrap": summary["ci"]})

        return compute

    def minus(row: str, column: str, placement: str) -> Value:
        return _contrast([(1, diff(row, column, placement))])

    def drop(row: str, column: str, placement: str) -> Value:
        return _contrast([(1, own(row, "1x", placement)), (-1, own(row, column, placement))])

    def drop_minus(row: str, column: str, placement: str) -> Value:
        return _contrast([(1, diff(row, "1x", placement)), (-1, diff(row, column, placement))])

    def at_1x(placement: str) -> Callable[[str], str | None]:
        """The 1x level is a family of its own per placement (the two are the same instances); beyond 1x the drop is
        what is scored."""
        return lambda column: f"level at 1x, {placement}" if column == "1x" else None

    tables = []
    for placement in placements:
        at = lambda compute, placement=placement: functools.partial(compute, placement=placement)
        family = lambda name, placement=placement: lambda c: name + question(placement)
        tables += [
            Table(f"{placement}: per-query", rows, columns, accuracy(placement, False)),
            Table(f"{placement}: first-time", rows, columns, accuracy(placement, True)),
            Table(f"{placement}: minus softmax's", others, columns, at(minus), at_1x(placement)),
            Table(f"{placement}: drop from 1x", rows, longer, at(drop), family("own drop")),
            Table(f"{placement}: drop minus softmax's", others, longer, at(drop_minus), family("drop")),
        ]
    for a, b, _ in mqar_report.CONTRASTS:
        if {a, b} <= measured:
            cost = lambda row, column, a=a, b=b: _contrast([(1, own(row, column, a)), (-1, own(row, column, b))])
            tables.append(Table(f"{a} minus {b}", rows, longer, cost, lambda c, name=f"{a} minus {b}": name))

    def switched_minus_trained(row: str, column: str, placement: str) -> Value:
        """A switch's accuracy minus the same runs' as trained, paired by seed and instance (the same instances)."""
        trained, switched = runs.groups[(runs.names[row][0], "none")], runs.group(row)
        seeds = runs.seeds(switched, trained)
        return _contrast([(1, instances(switched, seeds, column, placement)), (-1, instances(trained, seeds, column, placement))])

    switches = [n for n, (variant, switch) in runs.names.items() if switch != "none" and (variant, "none") in runs.groups]
    if switches:
        for placement in placements:
            at = functools.partial(switched_minus_trained, placement=placement)
            tables.append(Table(f"{placement}: switched minus as trained", switches, columns, at, lambda c: "switch"))
    return _with_holm(tables)


def _ruler_tables(runs: Runs) -> list[Table]:
    """Per RULER-style score (ruler_report.METRICS): each variant's mean by task and length with its Student t interval
    over seeds (each seed's examples averaged first, as the suite's report), and its difference from softmax's, paired
    by seed and example (every variant answers the same examples), Holm-adjusted over the score's cells. The differences
    are taken at the lengths where every variant scores every task (none is n/a in the report); a level is a LookupError
    where not scored."""
    base_name = plots.group_name(*BASELINE, 1)
    tasks = [*dict.fromkeys(c.task for r in runs.groups[BASELINE] for c in r.ruler), ruler_report.AVERAGE]
    rows = {f"{name} {task}": (name, task) for name in runs.names for task in tasks}
    columns = [_x(m) for m in MULTIPLIERS]

    def scores(name: str, seeds: list[int], task: str, column: str, metric: str) -> np.ndarray:
        """[R, W] of the group `name`'s runs of these seeds, in this order."""
        picked = [r for s in seeds for r in runs.group(name) if r.seed == s]
        values_RW = ruler_report.values(picked, task, _multiplier(column), metric)
        if values_RW is None:
            raise LookupError(f"{name} {task} is not scored at {column}")
        return values_RW

    def level(metric: str) -> Callable[[str, str], Value]:
        def compute(row: str, column: str) -> Value:
            name, task = rows[row]
            summary = stats.seed_level([(1.0, scores(name, runs.seeds(runs.group(name)), task, column, metric))])
            return Value(summary["difference"], {"t": summary["ci"]}, per_seed=summary["per_seed"])

        return compute

    def minus(metric: str) -> Callable[[str, str], Value]:
        def compute(row: str, column: str) -> Value:
            name, task = rows[row]
            seeds = runs.seeds(runs.group(name), runs.groups[BASELINE])
            ours, softmax = (scores(n, seeds, task, column, metric) for n in (name, base_name))
            return _contrast([(1, ours), (-1, softmax)])

        return compute

    def scored(name: str, task: str, column: str) -> bool:
        return ruler_report.values(runs.group(name), task, _multiplier(column), "match") is not None

    shared = [c for c in columns if all(scored(name, task, c) for name, task in rows.values())]
    others = [r for r, (name, _) in rows.items() if name != base_name] if shared else []
    tables = []
    for metric in ruler_report.METRICS:
        tables += [
            Table(f"RULER {metric}", list(rows), columns, level(metric)),
            Table(f"RULER minus softmax's {metric}", others, shared, minus(metric), lambda c, metric=metric: metric),
        ]
    return _with_holm(tables)


@functools.cache
def tables(source: str) -> list[Table]:
    """The computed tables of a source (see SOURCES), each read from its committed results file once."""
    return SOURCES[source]()


SOURCES: dict[str, Callable[[], list[Table]]] = {
    "text": lambda: (lambda runs: _loss_tables(runs, DIRECT["text"]) + _run_tables(runs))(Runs(DATA / "results.json.gz")),
    "switch": lambda: _loss_tables(Runs(DATA / "switch" / "results.json.gz"), DIRECT["switch"]),
    # the `text` runs and lssar, lssar_fixed on more seeds (loss measured alike; one passkey depth and key)
    "contrast": lambda: _loss_tables(Runs(DATA / "results.json.gz", DATA / "contrast" / "results.json.gz"), DIRECT["text"]),
    # the softmax -> softmax continuation control, with its own softmax runs (retrained: the switch runs are not kept)
    "switch_control": lambda: _loss_tables(Runs(DATA / "switch_control" / "results.json.gz"), []),
    "mqar": lambda: _mqar_tables(Runs(DATA / "mqar_results.json.gz")),
    # dilution and RoPE's base on MQAR: retrained runs of their own (the runs behind `mqar` were not kept)
    "mqar_dilute": lambda: _mqar_tables(Runs(DATA / "mqar_dilute" / "results.json.gz")),
    "demo": lambda: _loss_tables(Runs(DATA.parent / "demo" / "results.json.gz"), []),
    "ruler": lambda: _ruler_tables(Runs(DATA / "ruler" / "results.json.gz")),
}


def _signed(x: float) -> str:
    return f"{x:+.3f}".replace("-", "−")


def cell_text(value: Value, kinds: list[str]) -> str:
    """A cell as the pages print it: the value, its intervals of these types in order, the multiple, the Holm p."""
    parts = [_signed(value.value), *(f"[{_signed(lo)}, {_signed(hi)}]" for lo, hi in (value.intervals[k] for k in kinds))]
    parts += [f"({value.multiple:.2f}x)"] if value.multiple is not None else []
    return " ".join(parts + ([f"p={value.p:.3f}"] if value.p is not None else []))


def main(source: str, title: str, kinds: str = "") -> None:
    """Prints the rows of the computed tables of `source` whose title holds `title`."""
    for table in (t for t in tables(source) if title in t.title):
        print(f"{table.title}\n| row | " + " | ".join(table.columns) + " |")
        for row in table.rows:
            cells = [cell_text(table.compute(row, c), kinds.split(",") if kinds else []) for c in table.columns]
            print(f"| {row} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(*sys.argv[1:])
