"""Paired hierarchical bootstrap (evaluation.stats): zero-centred for identical runs, detects a shift."""

import numpy as np
import pytest

from freeatten_jax.evaluation import stats


def test_identical_runs_give_a_zero_interval_and_noise_a_zero_centred_one():
    base_RW = np.random.default_rng(0).normal(3.0, 0.5, size=(3, 200))
    same = stats.paired_difference(base_RW, base_RW.copy())
    assert same["difference"] == 0.0 and same["ci"] == (0.0, 0.0)
    noisy = stats.paired_difference(base_RW + np.random.default_rng(1).normal(0, 0.1, size=(3, 200)), base_RW)
    low, high = noisy["ci"]
    assert low < 0 < high and abs((low + high) / 2) < 0.02


def test_a_shifted_run_is_detected_and_the_interval_covers_the_shift():
    base_RW = np.random.default_rng(0).normal(3.0, 0.5, size=(3, 200))
    shifted = stats.paired_difference(base_RW + 0.05 + np.random.default_rng(1).normal(0, 0.1, size=(3, 200)), base_RW)
    low, high = shifted["ci"]
    assert 0 < low < 0.05 < high and shifted["difference"] == pytest.approx(0.05, abs=0.01)


def test_seeds_are_resampled_too():
    """A per-seed offset (seed-to-seed variation) widens the interval; windows alone would not see it."""
    base_RW = np.random.default_rng(0).normal(3.0, 0.5, size=(3, 200))
    per_seed = np.array([[-0.1], [0.0], [0.3]])
    wide = stats.paired_difference(base_RW + per_seed, base_RW)
    narrow = stats.paired_difference(base_RW + per_seed[[1]], base_RW)
    assert wide["ci"][1] - wide["ci"][0] > 0.2 and narrow["ci"][1] - narrow["ci"][0] < 1e-9
    with pytest.raises(ValueError, match="equal shapes"):
        stats.paired_difference(base_RW, base_RW[:2])


def test_windows_are_resampled_within_a_run():
    """One run: the interval is the window bootstrap's, about 2 x 1.96 sd / sqrt(W) wide."""
    diff_1W = np.random.default_rng(2).normal(0.0, 0.1, size=(1, 400))
    low, high = stats.paired_difference(diff_1W, np.zeros_like(diff_1W))["ci"]
    assert 0.015 < high - low < 0.025


def test_a_contrast_draws_the_same_seeds_for_every_term():
    """The rise of a difference (8x minus 1x): a per-seed offset common to both lengths cancels (the same seeds are drawn
    for both terms: independent draws would keep it); a rise only at 8x is detected."""
    rng = np.random.default_rng(3)
    per_seed = np.array([[-0.3], [0.0], [0.4]])
    one_RW, eight_RW = rng.normal(0, 0.05, (3, 100)) + per_seed, rng.normal(0, 0.05, (3, 25)) + per_seed
    flat = stats.contrast([(1, eight_RW), (-1, one_RW)])
    assert flat["ci"][1] - flat["ci"][0] < 0.1 and flat["ci"][0] < 0 < flat["ci"][1]  # the offsets cancel: narrow
    risen = stats.contrast([(1, eight_RW + 0.2), (-1, one_RW)])
    assert 0.1 < risen["ci"][0] < 0.2 < risen["ci"][1] and risen["difference"] == pytest.approx(0.2, abs=0.05)
    with pytest.raises(ValueError, match="same runs"):
        stats.contrast([(1, eight_RW), (-1, one_RW[:2])])


def test_seed_level_interval_is_students_t_over_the_per_seed_contrasts():
    """Three seeds whose differences average 1, 2 and 3 over their windows: mean 2, sd 1, t(0.975, df 2) = 4.303, so
    the interval is 2 -/+ 4.303 / sqrt(3); a bootstrap over the same 3 seeds is far narrower (it cannot reach beyond
    the lowest and the highest seed)."""
    rng = np.random.default_rng(0)
    noise_RW = rng.normal(0, 0.2, size=(3, 50))
    base_RW = rng.normal(3.0, 0.5, size=(3, 50))
    ours_RW = base_RW + np.array([[1.0], [2.0], [3.0]]) + noise_RW - noise_RW.mean(1, keepdims=True)
    seed = stats.seed_level([(1, ours_RW), (-1, base_RW)])
    assert seed["per_seed"] == pytest.approx([1.0, 2.0, 3.0]) and seed["difference"] == pytest.approx(2.0)
    assert seed["ci"] == pytest.approx((2.0 - 4.302653 / np.sqrt(3), 2.0 + 4.302653 / np.sqrt(3)), rel=1e-6)
    boot = stats.paired_difference(ours_RW, base_RW)["ci"]
    assert seed["ci"][0] < 0 < boot[0] and boot[1] <= 3.1  # resolved by the bootstrap, not over seeds
    one = stats.seed_level([(1, ours_RW[:1]), (-1, base_RW[:1])])
    assert one["difference"] == pytest.approx(1.0) and np.isnan(one["ci"]).all()  # no interval from one seed
