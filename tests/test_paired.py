"""The report's comparisons against softmax (evaluation.paired): differences, rises and rises relative to softmax's,
paired by seed and window."""

import numpy as np

from freeatten_jax.evaluation import paired


def _run(variant, seed, losses_by_multiplier):
    return {
        "variant": variant,
        "switch": "none",
        "seed": seed,
        "lengths": [{"multiplier": m, "per_window": list(w)} for m, w in losses_by_multiplier.items()],
    }


def _rows(text: str, variant: str) -> list[list[str]]:
    return [line.strip("| ").split(" | ")[1:] for line in text.splitlines() if line.startswith(f"| {variant}")]


def test_identical_runs_differ_by_zero_and_a_rise_at_the_long_length_is_detected():
    rng = np.random.default_rng(0)
    base = [{1: rng.normal(2.0, 0.2, 32), 8: rng.normal(2.5, 0.2, 4)} for _ in range(3)]
    softmax = [_run("softmax", s, b) for s, b in enumerate(base)]
    same = [_run("lssa", s, b) for s, b in enumerate(base)]
    difference, rise, relative = _rows(paired.markdown(softmax + same, [1, 8]), "lssa (3 runs)")
    assert difference == ["+0.000 [+0.000, +0.000]"] * 2 and relative == ["+0.000 [+0.000, +0.000] (1.00x)"]
    flatter = [_run("lssar", s, {1: b[1] - 0.1, 8: b[8] - 0.4}) for s, b in enumerate(base)]
    text = paired.markdown(softmax + flatter, [1, 8])
    difference, rise, relative = _rows(text, "lssar (3 runs)")
    assert difference == ["-0.100 [-0.100, -0.100]", "-0.400 [-0.400, -0.400]"]
    softmax_rise = np.mean([b[8].mean() - b[1].mean() for b in base])
    assert relative == [f"-0.300 [-0.300, -0.300] ({(softmax_rise - 0.3) / softmax_rise:.2f}x)"]
    assert _rows(text, "softmax (3 runs)")[0][0].startswith(f"{softmax_rise:+.3f} [")  # softmax's own rise, with its interval
    assert paired.markdown(flatter, [1, 8]) == ""  # no baseline: no table
