"""autorl.judge.noise: the run-level variance estimate, the prior, the t quantiles, on data with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from autorl.judge.noise import gain, posterior_s2, run_noise, t_quantiles


def test_run_noise_recovers_a_known_run_variance():
    rng = np.random.default_rng(0)
    n, sd = 2000, 0.05
    p = rng.uniform(0.2, 0.8, n)
    groups = [(rng.random((4, n)) < np.clip(p + rng.normal(0, sd, (4, 1)), 0, 1)).astype(float) for _ in range(200)]
    s2, ms, df = run_noise(groups)
    assert df == 200 * 3
    assert float(s2) == pytest.approx(sd**2, rel=0.15)
    assert float(ms) > float(s2)  # a run mean also carries the flips


def test_run_noise_is_unbiased_at_zero_and_may_be_negative():
    rng = np.random.default_rng(1)
    p = rng.uniform(0.2, 0.8, 300)
    raws = [float(run_noise([(rng.random((3, 300)) < p).astype(float)])[0]) for _ in range(400)]
    assert min(raws) < 0 < max(raws)
    assert abs(np.mean(raws)) < 1e-4  # unbiased (3 se); clipping at 0 would give a mean near +2.6e-4
    assert np.mean(np.maximum(raws, 0)) > 2e-4


def test_no_replicates_means_zero_df():
    s2, ms, df = run_noise([np.zeros((1, 10))])
    assert df == 0 and float(s2) == 0.0


def test_posterior_is_the_prior_without_data_and_floors_only_the_combination():
    s2, var = posterior_s2(np.asarray(0.0), np.asarray(0.0), 0, 0.02, 1.0)
    assert float(s2) == pytest.approx(4e-4) and float(var) == pytest.approx(2 * 0.02**4)
    low, _ = posterior_s2(np.asarray(-0.01), np.asarray(0.0), 2, 0.02, 1.0)
    assert float(low) == 0.0
    mixed, _ = posterior_s2(np.asarray(1e-3), np.asarray(2e-3), 3, 0.02, 1.0)
    assert float(mixed) == pytest.approx((4e-4 + 3e-3) / 4)


def test_t_quantiles_known_values_and_conservative_rounding():
    q = t_quantiles(0.975, np.array([1.0, 2.0, 10.0, 1e9]))
    assert q == pytest.approx([12.706, 4.303, 2.228, 1.960], abs=2e-3)
    assert t_quantiles(0.975, np.array([2.1]))[0] == pytest.approx(4.303, abs=1e-3)  # 2.1 rounds down to 2.0


def test_gain_is_vectorised_and_matches_one_case():
    rng = np.random.default_rng(2)
    p = rng.uniform(0.1, 0.9, 100)
    t = (rng.random((5, 1, 100)) < p).astype(float)
    b = (rng.random((5, 3, 100)) < p).astype(float)
    batch = gain(t, b, [b], [], 0.02, 1.0, 0.95)
    one = gain(t[2], b[2], [b[2]], [], 0.02, 1.0, 0.95)
    for key in ("delta", "low", "high", "df"):
        assert batch[key][2] == pytest.approx(float(one[key]))


def test_gain_interval_covers_the_true_effect_at_the_nominal_rate():
    rng = np.random.default_rng(3)
    p = rng.uniform(0.1, 0.9, 300)
    shift = lambda k, r: rng.normal(0, 0.03, (k, r, 1))  # noqa: E731
    t = (rng.random((2000, 1, 300)) < np.clip(p + 0.05 + shift(2000, 1), 0, 1)).astype(float)
    b = (rng.random((2000, 3, 300)) < np.clip(p + shift(2000, 3), 0, 1)).astype(float)
    g = gain(t, b, [b], [], 0.02, 1.0, 0.95)
    covered = ((g["low"] < 0.05) & (g["high"] > 0.05)).mean()
    assert 0.93 <= covered <= 0.995
