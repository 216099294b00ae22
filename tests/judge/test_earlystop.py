"""drop_stop(): a full run stops on drops beyond the eval's noise, with patience; flat runs go on."""

from __future__ import annotations

import numpy as np

from autorl.judge.earlystop import OOD_KEY, drop_stop

ITEMS_KEY = "eval/ood/items"


def series(rng, rates: list[float], n: int = 300, p=None) -> list[dict]:
    p = rng.uniform(0.0, 1.0, n) if p is None else p
    out = []
    for step, r in enumerate(rates):
        it = (rng.random(n) < np.clip(p + r - 0.5, 0, 1)).astype(int).tolist()
        out.append({"type": "eval", "step": 10 * step, OOD_KEY: sum(it) / n, ITEMS_KEY: it})
    return out


def test_a_real_drop_stops_and_names_the_best_step():
    rng = np.random.default_rng(0)
    evals = series(rng, [0.4, 0.5, 0.6, 0.6, 0.35, 0.3])
    d = drop_stop(evals)
    assert d is not None and d.best_step in (20, 30) and len(d.recent) == 2


def test_one_drop_is_not_enough():
    rng = np.random.default_rng(1)
    assert drop_stop(series(rng, [0.4, 0.5, 0.6, 0.6, 0.6, 0.3])) is None


def test_flat_runs_rarely_stop():
    rng = np.random.default_rng(2)
    stopped = 0
    for _ in range(100):
        evals = series(rng, [0.5] * 13)
        stopped += any(drop_stop(evals[:k]) is not None for k in range(3, 14))
    assert stopped <= 10  # the old two-consecutive-drops rule stopped ~84% of these


def test_improving_runs_do_not_stop():
    rng = np.random.default_rng(3)
    stopped = 0
    for _ in range(50):
        evals = series(rng, list(np.linspace(0.3, 0.6, 13)))
        stopped += any(drop_stop(evals[:k]) is not None for k in range(3, 14))
    assert stopped <= 2


def test_without_items_the_binomial_noise_is_used():
    evals = [{"type": "eval", "step": s, OOD_KEY: v} for s, v in [(0, 0.6), (10, 0.4), (20, 0.4)]]
    assert drop_stop(evals) is None  # no n known: no noise scale, never a stop on values alone
    with_n = [{**e, ITEMS_KEY: [0] * 500} for e in evals[:1]] + evals[1:]
    assert drop_stop(with_n) is not None  # 500 items: 0.6 -> 0.4 is ~6 standard errors


def test_minimize():
    evals = [{"type": "eval", "step": s, "loss": v, "eval/x/items": None} for s, v in [(0, 0.1), (1, 0.5), (2, 0.6)]]
    assert drop_stop(evals, key="loss", maximize=False) is None  # no item count: no noise scale
