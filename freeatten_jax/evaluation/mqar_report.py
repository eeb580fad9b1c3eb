"""The MQAR part of the suite's report: mqar.csv (one row per run, placement and length), mqar_queries.csv.gz (one
row per query), and per placement: accuracy by length per variant (all queries, and first-time queries), then the
differences against softmax paired by seed, with two intervals: the hierarchical bootstrap (evaluation.stats: seeds,
then instances, resampled) and a Student t interval over the per-seed differences; last, per variant, placement start minus end
(the cost of distance, N_i held equal) and dilute minus end (the cost of competing keys, distance and N_i held equal).

Glossary: R runs (seeds) of a group, W instances (the same pairs at every length), P queries per instance.
"""

import csv
import gzip

import numpy as np

from freeatten_jax.evaluation import plots, stats
from freeatten_jax.evaluation.results import MqarLength, RunResult

BASELINE = ("softmax", "none")  # the group every other is compared with, run by run (same seed)
# placement minus placement per variant, with what it measures
CONTRASTS = (
    ("start", "end", "what reaching further back costs at the same N_i"),
    ("dilute", "end", "what competing keys cost at the same distance and N_i"),
)


def csv_rows(runs: list[RunResult]) -> tuple[list[str], list[list]]:
    """(header, rows) of mqar.csv: one row per run, placement and length."""
    header = ["variant", "switch", "seed", "train_len", "placement", "length", "accuracy", "first_time_accuracy", "queries"]
    return header, [
        [r.variant, r.switch, r.seed, r.train_len, x.placement, x.length, x.accuracy, x.first_time_accuracy, x.queries]
        for r in runs
        for x in r.mqar
    ]


def write_queries(path, runs: list[RunResult]) -> None:
    """mqar_queries.csv.gz: every scored query, whether it was answered, whether an earlier query of its instance
    asked for the same key, and its distance (tokens) back to its pair."""
    with gzip.open(path, "wt", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["variant", "switch", "seed", "placement", "length", "instance", "slot", "repeated", "distance", "hit"])
        for r in runs:
            for x in r.mqar:
                for b, (hits, repeated, distance) in enumerate(zip(x.hits, x.repeated, x.distance)):
                    for p, row in enumerate(zip(repeated, distance, hits)):
                        writer.writerow([r.variant, r.switch, r.seed, x.placement, x.length, b, p, *row])


def _row(r: RunResult, multiplier: int, placement: str) -> MqarLength:
    return next(x for x in r.mqar if x.multiplier == multiplier and x.placement == placement)


def per_instance(rs: list[RunResult], multiplier: int, placement: str = "start", first_time: bool = False) -> np.ndarray:
    """[R, W] per-instance accuracies of the runs at one multiplier and placement (on first-time queries only: every
    instance's first query is one), runs ordered by seed."""
    rows = [_row(r, multiplier, placement) for r in sorted(rs, key=lambda r: r.seed)]
    if not first_time:
        return np.asarray([x.per_instance for x in rows])
    fresh_RWP = [np.asarray(x.repeated) == 0 for x in rows]
    return np.asarray([[h[f].mean() for h, f in zip(np.asarray(x.hits), fresh_WP)] for x, fresh_WP in zip(rows, fresh_RWP)])


def _cell(summary: dict, key: str) -> str:
    low, high = summary["ci"]
    return (
        f"{summary[key]:+.3f} [{low:+.3f}, {high:+.3f}]" if key == "difference" else f"{summary[key]:.3f} [{low:.3f}, {high:.3f}]"
    )


def _accuracy(rs: list[RunResult], multiplier: int, placement: str, first_time: bool) -> str:
    return _cell(stats.mean_with_interval(per_instance(rs, multiplier, placement, first_time)), "mean")


def _paired(rs: list[RunResult], base: list[RunResult], multiplier: int, placement: str) -> tuple[str, str]:
    """The group's accuracy minus the baseline's on the seeds both have: (bootstrap cell, seed-level cell), or n/a."""
    seeds = sorted({r.seed for r in rs} & {r.seed for r in base})
    if not seeds or rs is base:
        return "n/a", "n/a"
    pick = lambda group: per_instance([r for r in group if r.seed in seeds], multiplier, placement)
    ours, theirs = pick(rs), pick(base)
    seed_level = stats.seed_level([(1, ours), (-1, theirs)])
    per_seed = " ".join(f"{d:+.2f}" for d in seed_level["per_seed"])
    return _cell(stats.paired_difference(ours, theirs), "difference"), f"{_cell(seed_level, 'difference')} ({per_seed})"


def markdown(runs: list[RunResult]) -> str:
    """Per placement: the accuracy tables (all queries, first-time queries) and the paired-difference tables."""
    grouped = plots.groups(runs)
    multipliers = sorted({x.multiplier for r in runs for x in r.mqar})
    placements = list(dict.fromkeys(x.placement for r in runs for x in r.mqar))
    names = {key: plots.group_name(*key, len(rs)) for key, rs in grouped.items()}
    header = "| variant | " + " | ".join(f"{m}x" for m in multipliers) + " |\n|" + "---|" * (len(multipliers) + 1)
    table = lambda rows: header + "\n" + "\n".join(f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows)
    base = grouped.get(BASELINE, [])
    queries = sorted({x.queries for r in runs for x in r.mqar})
    parts = [
        f"MQAR: {'/'.join(map(str, queries))} queries per run, placement and length; training length {runs[0].train_len}. "
        "Placement start: the pairs where training put them, more noise before the queries (distance and the keys "
        "seen, N_i, grow together); end: noise first, the training window last (N_i grows, distance as in training); "
        "dilute: as end, with competing pairs of unqueried keys in the noise, as dense as in training."
    ]
    for placement in placements:
        parts += [
            f"## MQAR, placement {placement}: per-query accuracy by length (mean [95% interval: seeds, then instances, "
            "resampled])",
            table([(names[g], [_accuracy(rs, m, placement, False) for m in multipliers]) for g, rs in grouped.items()]),
            f"## MQAR, placement {placement}: accuracy on first-time queries (a key no earlier query of the instance "
            "asked for; same format)",
            table([(names[g], [_accuracy(rs, m, placement, True) for m in multipliers]) for g, rs in grouped.items()]),
        ]
        if base:
            cells = {g: [_paired(rs, base, m, placement) for m in multipliers] for g, rs in grouped.items() if g != BASELINE}
            parts += [
                f"## MQAR, placement {placement}: accuracy minus softmax's, paired by seed and instance "
                "(mean [95% bootstrap interval: seeds, then instances])",
                table([(names[g], [boot for boot, _ in row]) for g, row in cells.items()]),
                f"## MQAR, placement {placement}: the same difference per seed (mean [95% t interval over seeds] "
                "(each seed's difference)); a variant is ahead only where this interval excludes 0",
                table([(names[g], [seed for _, seed in row]) for g, row in cells.items()]),
            ]
    for a, b, what in CONTRASTS:
        if {a, b} <= set(placements):
            parts += [
                f"## MQAR: accuracy at placement {a} minus at {b}, run by run ({what}; mean [95% t interval over seeds] "
                "(each seed's difference))",
                table([(names[g], [_placement_cost(rs, m, a, b) for m in multipliers]) for g, rs in grouped.items()]),
            ]
    return "\n\n".join(parts)


def _placement_cost(rs: list[RunResult], multiplier: int, a: str, b: str) -> str:
    """Placement a minus b over the same instances, per seed, with a t interval over the seeds."""
    seed_level = stats.seed_level([(1, per_instance(rs, multiplier, a)), (-1, per_instance(rs, multiplier, b))])
    return f"{_cell(seed_level, 'difference')} ({' '.join(f'{d:+.2f}' for d in seed_level['per_seed'])})"
