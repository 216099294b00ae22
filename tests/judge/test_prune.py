"""should_prune(): stop only when clearly worse than the incumbent at the same step, on the same items."""

from __future__ import annotations

import numpy as np

from autorl.judge.prune import should_prune
from autorl.recipe import VerdictSettings

S = VerdictSettings()


def items(rng, p, effect=0.0) -> list[float]:
    return (rng.random(p.shape[0]) < np.clip(p + effect, 0, 1)).astype(float).tolist()


def test_clearly_worse_trial_is_pruned():
    rng = np.random.default_rng(0)
    p = rng.uniform(0.2, 0.8, 300)
    d = should_prune(10, items(rng, p, -0.3), [items(rng, p) for _ in range(3)], S, "maximize")
    assert d is not None and d.delta < -0.2 and d.ci_high < 0 and "step 10" in d.reason


def test_equal_trials_are_almost_never_pruned():
    rng = np.random.default_rng(1)
    p = rng.uniform(0.1, 0.9, 200)
    pruned = sum(should_prune(5, items(rng, p), [items(rng, p)], S, "maximize") is not None for _ in range(300))
    assert pruned <= 3  # the median pruner stops about half of these


def test_slightly_worse_is_not_enough():
    rng = np.random.default_rng(2)
    p = rng.uniform(0.1, 0.9, 200)
    pruned = sum(should_prune(5, items(rng, p, -0.03), [items(rng, p)], S, "maximize") is not None for _ in range(100))
    assert pruned <= 10


def test_no_items_or_other_items_means_no_decision():
    assert should_prune(5, None, [[1.0, 0.0]], S, "maximize") is None
    assert should_prune(5, [1.0, 0.0, 1.0], [[1.0, 0.0]], S, "maximize") is None
    assert should_prune(5, [0.0, 0.0], None, S, "maximize") is None


def test_minimize_prunes_the_higher_one():
    rng = np.random.default_rng(3)
    p = rng.uniform(0.2, 0.6, 300)
    assert should_prune(5, items(rng, p, 0.3), [items(rng, p)], S, "minimize") is not None
    assert should_prune(5, items(rng, p, -0.3), [items(rng, p)], S, "minimize") is None
