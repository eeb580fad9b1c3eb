"""The report's comparisons against softmax (evaluation.paired): differences, rises and rises relative to softmax's,
paired by seed and window."""

import numpy as np

from freeatten_jax.evaluation import paired, results


def _run(variant, seed, losses_by_multiplier):
    lengths = [
        results.LengthLoss(8 * m, m, float(np.mean(w)), (0.0, 0.0), 0.0, (0.0, 0.0), list(w), len(w), 8 * m * len(w))
        for m, w in losses_by_multiplier.items()
    ]
    return results.RunResult(f"{variant}{seed}", "", 1, variant, "none", seed, 8, 10_000.0, lengths=lengths)


def _rows(text: str, variant: str) -> list[list[str]]:
    return [line.strip("| ").split(" | ")[1:] for line in text.splitlines() if line.startswith(f"| {variant}")]


def test_identical_runs_differ_by_zero_and_a_rise_at_the_long_length_is_detected():
    rng = np.random.default_rng(0)
    base = [{1: rng.normal(2.0, 0.2, 32), 8: rng.normal(2.5, 0.2, 4)} for _ in range(3)]
    softmax = [_run("softmax", s, b) for s, b in enumerate(base)]
    same = [_run("lssa", s, b) for s, b in enumerate(base)]
    difference, rise, relative, *over_seeds = _rows(paired.markdown(softmax + same, [1, 8]), "lssa (3 runs)")
    assert difference == ["+0.000 [+0.000, +0.000]"] * 2 and relative == ["+0.000 [+0.000, +0.000] (1.00x)"]
    assert over_seeds == [["+0.000 [+0.000, +0.000]"] * 2, ["+0.000 [+0.000, +0.000]"]]
    flatter = [_run("lssar", s, {1: b[1] - 0.1, 8: b[8] - 0.4}) for s, b in enumerate(base)]
    text = paired.markdown(softmax + flatter, [1, 8])
    difference, rise, relative, *_ = _rows(text, "lssar (3 runs)")
    assert difference == ["-0.100 [-0.100, -0.100]", "-0.400 [-0.400, -0.400]"]
    softmax_rise = np.mean([b[8].mean() - b[1].mean() for b in base])
    assert relative == [f"-0.300 [-0.300, -0.300] ({(softmax_rise - 0.3) / softmax_rise:.2f}x)"]
    assert _rows(text, "softmax (3 runs)")[0][0].startswith(f"{softmax_rise:+.3f} [")  # softmax's own rise, with its interval
    assert paired.markdown(flatter, [1, 8]) == ""  # no baseline: no table


def test_beside_the_bootstrap_each_comparison_has_a_t_interval_over_seeds():
    """Seeds 0-2 shifted by 1, 2 and 3 times (-0.1 at 1x, -0.4 at 8x): per seed the rise differs from softmax's by
    -0.3, -0.6 and -0.9, so over seeds: mean -0.6, sd 0.3, half-width t(0.975, 2) x 0.3 / sqrt(3)."""
    rng = np.random.default_rng(0)
    base = [{1: rng.normal(2.0, 0.2, 32), 8: rng.normal(2.5, 0.2, 4)} for _ in range(3)]
    softmax = [_run("softmax", s, b) for s, b in enumerate(base)]
    spread = [_run("lssar", s, {1: b[1] - 0.1 * (s + 1), 8: b[8] - 0.4 * (s + 1)}) for s, b in enumerate(base)]
    *_, difference_seeds, relative_seeds = _rows(paired.markdown(softmax + spread, [1, 8]), "lssar (3 runs)")
    half = lambda sd: 4.302653 * sd / np.sqrt(3)
    assert difference_seeds == [
        f"-0.200 [{-0.2 - half(0.1):+.3f}, {-0.2 + half(0.1):+.3f}]",
        f"-0.800 [{-0.8 - half(0.4):+.3f}, {-0.8 + half(0.4):+.3f}]",
    ]
    assert relative_seeds == [f"-0.600 [{-0.6 - half(0.3):+.3f}, {-0.6 + half(0.3):+.3f}]"]


def test_one_seed_says_it_has_no_t_interval_instead_of_nan():
    """With one seed the Student t interval does not exist: the cell says so (it printed [+nan, +nan])."""
    rng = np.random.default_rng(1)
    base = {1: rng.normal(2.0, 0.2, 32), 8: rng.normal(2.5, 0.2, 4)}
    text = paired.markdown([_run("softmax", 0, base), _run("lssa", 0, {1: base[1] - 0.1, 8: base[8] - 0.4})], [1, 8])
    *_, difference_seeds, relative_seeds = _rows(text, "lssa |")
    assert difference_seeds == ["-0.100 (no interval: one seed)", "-0.400 (no interval: one seed)"]
    assert relative_seeds == ["-0.300 (no interval: one seed)"] and "nan" not in text
