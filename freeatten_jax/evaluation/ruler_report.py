"""The RULER-style suite's report section: per (variant, switch) group, task and length the mean score with its
seed-level interval (stats.seed_level: Student t over the group's runs, each run's examples averaged first), the
effective length, a CSV of every example and a heatmap of needle depth x length.

Glossary: R runs of a group, W examples.
"""

import csv
import pathlib

import numpy as np

from freeatten_jax.evaluation import plots, stats
from freeatten_jax.evaluation.results import RulerCell, RunResult

METRICS = {
    "match": "string match: fraction of the references in the greedy output (RULER's score)",
    "top1": "likelihood: fraction of the references ranked first among the candidate answers",
}
DEPTH_BINS = 5  # the heatmap's rows: needle depths in fifths of the haystack
AVERAGE = "average"  # the row of the mean over tasks


def effective_length(scores: dict[int, float | None], keep: float) -> int | None:
    """The largest multiplier up to which every score keeps at least `keep` x the score at the smallest multiplier
    (None: a length not scored); None where that score is missing or 0 (nothing to keep)."""
    multipliers = sorted(scores)
    reference = scores[multipliers[0]] if multipliers else None
    if not reference:
        return None
    longest = None
    for m in multipliers:
        if scores[m] is None or scores[m] < keep * reference:
            break
        longest = m
    return longest


def _cells(rs: list[RunResult], task: str, multiplier: int) -> list[RulerCell]:
    return [c for r in rs for c in r.ruler if c.task == task and c.multiplier == multiplier]


def values(rs: list[RunResult], task: str, multiplier: int, metric: str) -> np.ndarray | None:
    """[R, W] per-example values of the group's runs (the mean over tasks per run, [R, 1], for AVERAGE); None unless
    every run scored every cell asked for alike."""
    tasks = sorted({c.task for r in rs for c in r.ruler}) if task == AVERAGE else [task]
    per_task = []
    for t in tasks:
        cells = _cells(rs, t, multiplier)
        if len(cells) != len(rs) or any(c.reason or not c.match for c in cells) or len({len(c.match) for c in cells}) > 1:
            return None
        per_task.append(np.asarray([getattr(c, metric) for c in cells], np.float64))
    return per_task[0] if task != AVERAGE else np.mean([v.mean(1) for v in per_task], axis=0)[:, None]


def _summary(values_RW: np.ndarray | None) -> str:
    if values_RW is None:
        return "n/a"
    summary = stats.seed_level([(1.0, values_RW)])
    low, high = summary["ci"]
    return f"{summary['difference']:.3f}" + ("" if np.isnan(low) else f" [{low:.3f}, {high:.3f}]")


def markdown(runs: list[RunResult], settings: dict) -> list[str]:
    """The report's RULER section (none when no run has RULER cells): a table per metric, then why cells were not
    scored."""
    if not any(r.ruler for r in runs):
        return []
    multipliers, keep = settings["multipliers"], settings["ruler_keep"]
    tasks = [*dict.fromkeys(c.task for r in runs for c in r.ruler), AVERAGE]
    groups = plots.groups(runs)
    parts = [
        f"## RULER-style tasks (docs/method.md; {settings['ruler_examples']} examples per task and length, "
        f"{settings['ruler_candidates']} candidate answers per reference)\n\n"
        f"Mean over runs [95% Student t interval over runs (seeds)]; effective length: the longest multiplier up to "
        f"which the score keeps {keep:g} of the score at {multipliers[0]}x; {AVERAGE}: the mean over the tasks."
    ]
    for metric, what in METRICS.items():
        rows = []
        for (variant, switch), rs in groups.items():
            for task in tasks:
                by_m = {m: values(rs, task, m, metric) for m in multipliers}
                longest = effective_length({m: None if v is None else float(v.mean()) for m, v in by_m.items()}, keep)
                rows.append(
                    [
                        plots.group_name(variant, switch, len(rs)),
                        task,
                        *[_summary(by_m[m]) for m in multipliers],
                        "n/a" if longest is None else f"{longest}x",
                    ]
                )
        header = ["variant", "task", *[f"{m}x" for m in multipliers], "effective length"]
        table = "\n".join(
            ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *["| " + " | ".join(r) + " |" for r in rows]]
        )
        parts.append(f"### {what}\n\n{table}")
    reasons = sorted({(c.task, c.length, c.reason) for r in runs for c in r.ruler if c.reason})
    if reasons:
        parts.append("Not scored (n/a):\n" + "\n".join(f"- {t} at length {n}: {why}" for t, n, why in reasons))
    return ["\n\n".join(parts)]


def depth_grid(rs: list[RunResult], metric: str) -> tuple[list[int], list[float], np.ndarray]:
    """(lengths, depth bin centres, mean score [bin, length]) over the examples with one needle; NaN where none."""
    lengths = sorted({c.length for r in rs for c in r.ruler})
    total_DL, count_DL = np.zeros((DEPTH_BINS, len(lengths))), np.zeros((DEPTH_BINS, len(lengths)))
    for c in (c for r in rs for c in r.ruler):
        for depth, value in zip(c.depth, getattr(c, metric)):
            if depth is not None:
                row = min(int(depth * DEPTH_BINS), DEPTH_BINS - 1)
                total_DL[row, lengths.index(c.length)] += value
                count_DL[row, lengths.index(c.length)] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        return lengths, [(i + 0.5) / DEPTH_BINS for i in range(DEPTH_BINS)], np.where(count_DL > 0, total_DL / count_DL, np.nan)


def write(out: pathlib.Path, runs: list[RunResult]) -> dict[str, str]:
    """ruler.csv (one row per example) when the runs have RULER cells, and ruler.png (depth x length per group and
    metric) when they have single-needle examples; returns the figure as {title: file name}."""
    if not any(r.ruler for r in runs):
        return {}
    with (out / "ruler.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["run", "task", "length", "multiplier", "example", "match", "rank", "top1", "depth", "not_scored_because"]
        )
        for r in runs:
            for c in r.ruler:
                head = [r.label, c.task, c.length, c.multiplier]
                if c.reason:
                    writer.writerow([*head, *[""] * 5, c.reason])
                writer.writerows([*head, i, *row, ""] for i, row in enumerate(zip(c.match, c.rank, c.top1, c.depth)))
    if all(d is None for r in runs for c in r.ruler for d in c.depth):
        return {}
    grids = {
        f"{plots.group_name(*key, len(rs))}: {metric}": depth_grid(rs, metric)
        for key, rs in plots.groups(runs).items()
        for metric in METRICS
    }
    title = "RULER-style single-needle tasks (niah_single, niah_multikey) by needle depth (bin centre) and length"
    return {"RULER depth x length": plots.save(plots.draw_heatmaps(grids, title, "needle depth", "score"), out / "ruler.png")}
