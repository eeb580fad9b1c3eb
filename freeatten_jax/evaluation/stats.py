"""Paired, hierarchical bootstrap intervals for comparing variants scored on the same windows.

Every variant is scored on the same held-out windows (or MQAR instances), and seed s of every variant
shares its data order and initialisation seed, so differences are paired by seed and by window. The
bootstrap resamples seeds with replacement, then windows with replacement (the same window indices for
both sides), and takes the mean difference: its interval covers both which runs were trained and
which text was scored.

Glossary: R runs (seeds), W windows (or instances), N resamples.
"""
import numpy as np


def hierarchical_means(values_RW: np.ndarray, seed: int = 0, resamples: int = 2000) -> np.ndarray:
    """[N] bootstrap means of values [R, W]: R runs drawn with replacement, then W windows with replacement
    within each drawn run (one window draw per drawn run)."""
    values_RW = np.asarray(values_RW, np.float64)
    runs, windows = values_RW.shape
    rng = np.random.default_rng(seed)
    runs_NR = rng.integers(runs, size=(resamples, runs))
    windows_NRW = rng.integers(windows, size=(resamples, runs, windows))
    return values_RW[runs_NR[..., None], windows_NRW].mean(axis=(1, 2))


def interval(means_N: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The percentile interval of bootstrap means."""
    tail = (1 - level) / 2 * 100
    return float(np.percentile(means_N, tail)), float(np.percentile(means_N, 100 - tail))


def paired_difference(values_RW: np.ndarray, baseline_RW: np.ndarray, seed: int = 0, resamples: int = 2000,
                      level: float = 0.95) -> dict:
    """Mean of (values - baseline) over runs and windows, with its paired hierarchical bootstrap interval.

    Both arrays are [R, W] with run r and window w the same seed and the same text on both sides."""
    values_RW, baseline_RW = np.asarray(values_RW, np.float64), np.asarray(baseline_RW, np.float64)
    if values_RW.shape != baseline_RW.shape:
        raise ValueError(f"paired runs need equal shapes [runs, windows], got {values_RW.shape} and {baseline_RW.shape}")
    diff_RW = values_RW - baseline_RW
    low, high = interval(hierarchical_means(diff_RW, seed, resamples), level)
    return {"difference": float(diff_RW.mean()), "ci": (low, high), "runs": int(diff_RW.shape[0]), "windows": int(diff_RW.shape[1])}


def mean_with_interval(values_RW: np.ndarray, seed: int = 0, resamples: int = 2000, level: float = 0.95) -> dict:
    """Mean over runs and windows with its hierarchical bootstrap interval (seeds, then windows)."""
    values_RW = np.asarray(values_RW, np.float64)
    return {"mean": float(values_RW.mean()), "ci": interval(hierarchical_means(values_RW, seed, resamples), level)}
