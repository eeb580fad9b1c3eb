"""Paired, hierarchical bootstrap intervals for comparing variants scored on the same windows.

Every variant is scored on the same held-out windows (or MQAR instances), and seed s of every variant
shares its data order and initialisation seed, so differences are paired by seed and by window. The
bootstrap resamples seeds with replacement, then windows with replacement (the same window indices for
both sides), and takes the mean difference: its interval covers both which runs were trained and
which text was scored. `seed_level` computes the same contrast per seed with a Student t interval over seeds: it
covers which runs were trained only, and with few seeds it is the honest one (a bootstrap over 3 seeds spans little
more than the lowest to the highest seed).

Glossary: R runs (seeds), W windows (or instances), N resamples.
"""

import numpy as np
from scipy import stats as scipy_stats


def hierarchical_means(values_RW: np.ndarray, seed: int = 0, resamples: int = 2000) -> np.ndarray:
    """[N] bootstrap means of values [R, W]: R runs drawn with replacement, then W windows with replacement
    within each drawn run (one window draw per drawn run)."""
    return contrast_means([(1.0, values_RW)], seed, resamples)


def contrast_means(terms: list[tuple[float, np.ndarray]], seed: int = 0, resamples: int = 2000) -> np.ndarray:
    """[N] bootstrap values of sum_k sign_k * mean(values_k) for terms (sign_k, values_k [R, W_k]): the same R runs
    drawn for every term (a run is one seed of every variant), then each term's windows within each drawn run."""
    rng = np.random.default_rng(seed)
    runs = {np.shape(values)[0] for _, values in terms}
    if len(runs) != 1:
        raise ValueError(f"every term needs the same runs (seeds), got {sorted(runs)}")
    runs_NR = rng.integers(runs.pop(), size=(resamples, np.shape(terms[0][1])[0]))
    total_N = np.zeros(resamples)
    for sign, values in terms:
        values_RW = np.asarray(values, np.float64)
        windows_NRW = rng.integers(values_RW.shape[1], size=(resamples, *values_RW.shape))
        total_N += sign * values_RW[runs_NR[..., None], windows_NRW].mean(axis=(1, 2))
    return total_N


def contrast(terms: list[tuple[float, np.ndarray]], seed: int = 0, resamples: int = 2000, level: float = 0.95) -> dict:
    """sum_k sign_k * mean(values_k) with its hierarchical bootstrap interval (contrast_means), e.g. the rise from 1x
    to 8x of the per-window differences against a baseline: [(1, diff_8x), (-1, diff_1x)]."""
    value = sum(sign * float(np.mean(values)) for sign, values in terms)
    return {"difference": value, "ci": interval(contrast_means(terms, seed, resamples), level)}


def interval(means_N: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The percentile interval of bootstrap means."""
    tail = (1 - level) / 2 * 100
    return float(np.percentile(means_N, tail)), float(np.percentile(means_N, 100 - tail))


def paired_difference(
    values_RW: np.ndarray, baseline_RW: np.ndarray, seed: int = 0, resamples: int = 2000, level: float = 0.95
) -> dict:
    """Mean of (values - baseline) over runs and windows, with its paired hierarchical bootstrap interval.

    Both arrays are [R, W] with run r and window w the same seed and the same text on both sides."""
    values_RW, baseline_RW = np.asarray(values_RW, np.float64), np.asarray(baseline_RW, np.float64)
    if values_RW.shape != baseline_RW.shape:
        raise ValueError(f"paired runs need equal shapes [runs, windows], got {values_RW.shape} and {baseline_RW.shape}")
    diff_RW = values_RW - baseline_RW
    low, high = interval(hierarchical_means(diff_RW, seed, resamples), level)
    return {
        "difference": float(diff_RW.mean()),
        "ci": (low, high),
        "runs": int(diff_RW.shape[0]),
        "windows": int(diff_RW.shape[1]),
    }


def mean_with_interval(values_RW: np.ndarray, seed: int = 0, resamples: int = 2000, level: float = 0.95) -> dict:
    """Mean over runs and windows with its hierarchical bootstrap interval (seeds, then windows)."""
    values_RW = np.asarray(values_RW, np.float64)
    return {"mean": float(values_RW.mean()), "ci": interval(hierarchical_means(values_RW, seed, resamples), level)}


def seed_level(terms: list[tuple[float, np.ndarray]], level: float = 0.95) -> dict:
    """`contrast`'s value per seed (each run's windows averaged first), their mean and its Student t interval over
    seeds (df = seeds - 1; NaN bounds below 2 seeds): {"difference", "ci", "per_seed"}."""
    per_seed_R = sum(sign * np.asarray(values, np.float64).mean(axis=1) for sign, values in terms)
    mean, runs = float(np.mean(per_seed_R)), len(per_seed_R)
    half = np.nan
    if runs > 1:
        half = float(scipy_stats.t.ppf((1 + level) / 2, runs - 1) * np.std(per_seed_R, ddof=1) / np.sqrt(runs))
    return {"difference": mean, "ci": (mean - half, mean + half), "per_seed": [float(x) for x in per_seed_R]}
