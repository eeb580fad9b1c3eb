"""Loss comparisons against softmax in the papers' terms, paired by seed and window (evaluation.stats): the difference
in loss at each length, each group's rise from 1x, and that rise minus softmax's, each with a 95% interval over seeds,
then windows. Runs are paired by training seed; every run scores the same windows at each length.

Glossary: R runs (seeds both groups have), W windows at one length.
"""

import numpy as np

from freeatten_jax.evaluation import plots, stats
from freeatten_jax.evaluation.results import RunResult, loss_unit

BASELINE = ("softmax", "none")


def per_window(rs: list[RunResult], seeds: list[int], multiplier: int) -> np.ndarray:
    """[R, W] per-window losses of the runs with these seeds at one multiplier."""
    by_seed = {r.seed: r for r in rs}
    return np.asarray([by_seed[s].at(multiplier).per_window for s in seeds])


def _cell(summary: dict) -> str:
    """The difference and its interval ("no interval" where one seed gives none)."""
    low, high = summary["ci"]
    interval = f"[{low:+.3f}, {high:+.3f}]" if np.isfinite([low, high]).all() else "(no interval: one seed)"
    return f"{summary['difference']:+.3f} {interval}"


def _md(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows])


def markdown(runs: list[RunResult], multipliers: list[int]) -> str:
    """Three tables (loss minus softmax's; rise from 1x; rise minus softmax's rise, with the ratio of the means) with
    the hierarchical bootstrap's intervals, then the two comparisons against softmax again with Student t intervals
    over the per-seed values (stats.seed_level); an empty string when there is no softmax baseline or no 1x."""
    grouped = plots.groups(runs)
    base = grouped.get(BASELINE)
    if not base or 1 not in multipliers:
        return ""
    longer = [m for m in multipliers if m != 1]
    names = {g: plots.group_name(*g, len(rs)) for g, rs in grouped.items()}
    difference, rise, relative, difference_seeds, relative_seeds = [], [], [], [], []
    for g, rs in grouped.items():
        seeds = sorted({r.seed for r in rs} & {r.seed for r in base})
        if not seeds:
            continue
        own = {m: per_window(rs, seeds, m) for m in multipliers}
        ref = {m: per_window(base, seeds, m) for m in multipliers}
        rise.append([names[g]] + [_cell(stats.contrast([(1, own[m]), (-1, own[1])])) for m in longer])
        if g == BASELINE:
            continue
        diff = {m: own[m] - ref[m] for m in multipliers}
        difference.append([names[g]] + [_cell(stats.contrast([(1, diff[m])])) for m in multipliers])
        difference_seeds.append([names[g]] + [_cell(stats.seed_level([(1, diff[m])])) for m in multipliers])
        ratio = lambda m, own=own, ref=ref: (own[m].mean() - own[1].mean()) / (ref[m].mean() - ref[1].mean())
        relative.append(
            [names[g]] + [f"{_cell(stats.contrast([(1, diff[m]), (-1, diff[1])]))} ({ratio(m):.2f}x)" for m in longer]
        )
        relative_seeds.append([names[g]] + [_cell(stats.seed_level([(1, diff[m]), (-1, diff[1])])) for m in longer])
    lengths, unit = [f"{m}x" for m in multipliers], loss_unit(runs)
    return "\n\n".join(
        [
            "## Paired against softmax (seeds both have; 95% interval: seeds, then windows, resampled)",
            f"Loss minus softmax's at the same length ({unit})\n\n" + _md(["variant", *lengths], difference),
            f"Rise from 1x: loss at the length minus loss at 1x ({unit})\n\n" + _md(["variant", *lengths[1:]], rise),
            f"Rise minus softmax's rise, the papers' comparison ({unit}), and (the rise as a multiple of softmax's)\n\n"
            + _md(["variant", *lengths[1:]], relative),
            "## Paired against softmax over seeds (each seed's difference over its windows; 95% Student t interval over "
            "the seeds, which covers which runs were trained only: a difference is resolved where it excludes 0)",
            "Loss minus softmax's at the same length\n\n" + _md(["variant", *lengths], difference_seeds),
            "Rise minus softmax's rise\n\n" + _md(["variant", *lengths[1:]], relative_seeds),
        ]
    )
