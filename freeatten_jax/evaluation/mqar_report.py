"""The MQAR part of the suite's report: mqar.csv, accuracy by length per variant with paired differences against
softmax (evaluation.stats: seeds, then instances, resampled), and the plot.

Glossary: R runs (seeds) of a group, W instances (the same pairs at every length).
"""

import numpy as np

from freeatten_jax.evaluation import plots, stats

BASELINE = ("softmax", "none")  # the group every other is compared with, run by run (same seed)


def csv_rows(runs: list[dict]) -> tuple[list[str], list[list]]:
    """(header, rows) of mqar.csv: one row per run and length."""
    header = ["variant", "switch", "seed", "train_len", "length", "accuracy", "queries"]
    return header, [
        [r["variant"], r["switch"], r["seed"], r["train_len"], x["length"], x["accuracy"], x["queries"]]
        for r in runs
        for x in r["mqar"]
    ]


def per_instance(rs: list[dict], multiplier: int) -> np.ndarray:
    """[R, W] per-instance accuracies of the runs at one multiplier, runs ordered by seed."""
    return np.asarray(
        [next(x["per_instance"] for x in r["mqar"] if x["multiplier"] == multiplier) for r in sorted(rs, key=lambda r: r["seed"])]
    )


def _cell(summary: dict, key: str) -> str:
    low, high = summary["ci"]
    return (
        f"{summary[key]:+.3f} [{low:+.3f}, {high:+.3f}]" if key == "difference" else f"{summary[key]:.3f} [{low:.3f}, {high:.3f}]"
    )


def _paired(rs: list[dict], base: list[dict], multiplier: int) -> str:
    """The group's accuracy minus the baseline's on the seeds both have, or why not."""
    seeds = sorted({r["seed"] for r in rs} & {r["seed"] for r in base})
    if not seeds or rs is base:
        return "n/a"
    pick = lambda group: per_instance([r for r in group if r["seed"] in seeds], multiplier)
    return _cell(stats.paired_difference(pick(rs), pick(base)), "difference")


def markdown(runs: list[dict]) -> str:
    """The accuracy table and the paired-difference table."""
    grouped = plots.groups(runs)
    multipliers = sorted({x["multiplier"] for r in runs for x in r["mqar"]})
    names = {key: plots.group_name(*key, len(rs)) for key, rs in grouped.items()}
    header = "| variant | " + " | ".join(f"{m}x" for m in multipliers) + " |\n|" + "---|" * (len(multipliers) + 1)
    accuracy = [
        f"| {names[g]} | " + " | ".join(_cell(stats.mean_with_interval(per_instance(rs, m)), "mean") for m in multipliers) + " |"
        for g, rs in grouped.items()
    ]
    base = grouped.get(BASELINE, [])
    queries = sorted({x["queries"] for r in runs for x in r["mqar"]})
    parts = [
        f"## MQAR: per-query accuracy by length (mean [95% interval: seeds, then instances, resampled]; "
        f"{'/'.join(map(str, queries))} queries per run and length; training length {runs[0]['train_len']})",
        header + "\n" + "\n".join(accuracy),
    ]
    if base:
        differences = [
            f"| {names[g]} | " + " | ".join(_paired(rs, base, m) for m in multipliers) + " |"
            for g, rs in grouped.items()
            if g != BASELINE
        ]
        parts += [
            "## MQAR: accuracy minus softmax's, paired by seed and instance (mean [95% interval])",
            header + "\n" + "\n".join(differences),
        ]
    return "\n\n".join(parts)
