"""judge(): paired bootstrap with a run-level noise term, the fallbacks; flags(): one per health problem."""

from __future__ import annotations

import numpy as np
import pytest

from autorl.judge.verdict import UNKNOWN_NOISE_REL, flags, judge

N_ITEMS = 200


def runs(rng: np.random.Generator, p: np.ndarray, effect: float, n_runs: int, shift_sd: float = 0.0) -> list[list[int]]:
    """0/1 results per item for n_runs seeds: each item solved with prob p + effect (+ a per-run shift)."""
    out = []
    for _ in range(n_runs):
        q = np.clip(p + effect + rng.normal(0, shift_sd), 0, 1)
        out.append((rng.random(p.shape[0]) < q).astype(int).tolist())
    return out


def one_case(seed: int, effect: float, repeats: int = 2, shift_sd: float = 0.0, direction: str = "maximize"):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.1, 0.9, N_ITEMS)
    base = runs(rng, p, 0.0, repeats, shift_sd)
    trial = runs(rng, p, effect, 1, shift_sd)
    return judge(trial, base, [float(np.mean(trial[0]))], [float(np.mean(b)) for b in base],
                 min_effect=0.0, direction=direction, n_boot=400, seed=seed)


def test_true_15_point_gain_is_improved():
    calls = [one_case(seed, 0.15).verdict for seed in range(40)]
    assert calls.count("improved") >= 32  # power >= 80% with two baseline repeats
    v = one_case(3, 0.15)
    assert v.method == "paired_bootstrap+seed_var" and v.n == N_ITEMS
    assert v.ci_low < v.delta < v.ci_high and 0.08 < v.delta < 0.22


def test_no_effect_is_rarely_called_improved():
    calls = [one_case(1000 + seed, 0.0).verdict for seed in range(200)]
    assert calls.count("improved") < 10  # < 5% of 200 repeats


def test_no_effect_with_run_level_seed_noise_is_rarely_called_improved():
    calls = [one_case(5000 + seed, 0.0, repeats=3, shift_sd=0.03).verdict for seed in range(200)]
    assert calls.count("improved") < 10


def test_true_loss_is_regressed():
    v = one_case(7, -0.15)
    assert v.verdict == "regressed" and v.ci_high < 0


def test_minimize_flips_the_sign():
    # items as errors (1 = wrong): 15 points fewer errors is an improvement when minimizing
    up = one_case(7, -0.15, direction="maximize")
    down = one_case(7, -0.15, direction="minimize")
    assert up.verdict == "regressed" and down.verdict == "improved"
    assert down.delta == pytest.approx(-up.delta)
    assert (down.ci_low, down.ci_high) == pytest.approx((-up.ci_high, -up.ci_low))


def test_min_effect_raises_the_bar():
    v = one_case(3, 0.15)
    strict = judge(*_replay(3, 0.15), min_effect=v.ci_low + 0.01, direction="maximize", n_boot=400, seed=3)
    assert strict.verdict == "flat" and "min_effect" in strict.explanation


def _replay(seed: int, effect: float):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.1, 0.9, N_ITEMS)
    base = runs(rng, p, 0.0, 2)
    trial = runs(rng, p, effect, 1)
    return trial, base, [float(np.mean(trial[0]))], [float(np.mean(b)) for b in base]


def test_disagreeing_repeats_widen_the_interval():
    rng = np.random.default_rng(0)
    p = rng.uniform(0.2, 0.8, N_ITEMS)
    trial = runs(rng, p, 0.1, 1)
    close = runs(rng, p, 0.0, 1) * 2  # two identical repeats: no run-level spread
    far = [runs(rng, np.clip(p - 0.08, 0, 1), 0.0, 1)[0], runs(rng, np.clip(p + 0.08, 0, 1), 0.0, 1)[0]]
    a = judge(trial, close, [0.0], [0.0, 0.0], 0.0, "maximize", 400, 0)
    b = judge(trial, far, [0.0], [0.0, 0.0], 0.0, "maximize", 400, 0)
    assert (b.ci_high - b.ci_low) > 1.5 * (a.ci_high - a.ci_low)


def test_single_baseline_run_uses_plain_paired_bootstrap():
    rng = np.random.default_rng(2)
    p = rng.uniform(0.1, 0.9, N_ITEMS)
    v = judge(runs(rng, p, 0.2, 1), runs(rng, p, 0.0, 1), [0.7], [0.5], 0.0, "maximize", 400, 2)
    assert v.method == "paired_bootstrap" and "one baseline run" in v.explanation
    assert v.verdict == "improved"


def test_fallback_t_interval_from_repeats():
    v = judge(None, None, [0.62], [0.50, 0.52, 0.49, 0.51], 0.0, "maximize", 400, 0)
    assert v.method == "repeats_t" and v.n == 5
    assert v.verdict == "improved" and v.delta == pytest.approx(0.115)
    noisy = judge(None, None, [0.62], [0.40, 0.60], 0.0, "maximize", 400, 0)
    assert noisy.verdict == "flat"  # 1 degree of freedom: t = 12.7, the interval is wide


def test_fallback_with_unknown_noise_is_conservative():
    small = judge(None, None, [0.53], [0.50], 0.0, "maximize", 400, 0)
    assert small.method == "unknown_noise" and small.verdict == "flat" and "noise unknown" in small.explanation
    big = judge(None, None, [0.70], [0.50], 0.0, "maximize", 400, 0)
    assert big.verdict == "improved"
    assert big.ci_low == pytest.approx(0.2 - UNKNOWN_NOISE_REL * 0.7)


def test_mismatched_item_lists_fall_back_to_values():
    v = judge([[1, 0, 1]], [[1, 0], [0, 0]], [0.66], [0.5, 0.4], 0.0, "maximize", 400, 0)
    assert v.method == "repeats_t"


def test_bad_direction_and_missing_values_raise():
    with pytest.raises(ValueError, match="direction"):
        judge(None, None, [1.0], [1.0], 0.0, "max", 400, 0)
    with pytest.raises(ValueError, match="at least one"):
        judge(None, None, [], [1.0], 0.0, "maximize", 400, 0)


# ---- flags -----------------------------------------------------------------------------

def steps_of(n: int, **series) -> list[dict]:
    rows = []
    for i in range(n):
        row = {"type": "step", "step": i + 1}
        row.update({k: (f(i) if callable(f) else f) for k, f in series.items()})
        rows.append(row)
    return rows


HEALTHY = steps_of(20, reward_mean=lambda i: 0.3 + 0.005 * i, response_length_mean=lambda i: 40 + (i % 3),
                   truncated_rate=lambda i: 0.1 + 0.5 * (i == 7))
HEALTHY_EVALS = [{"type": "eval", "step": s, "eval/ood/greedy_pass@1": v} for s, v in [(5, 0.30), (10, 0.33), (15, 0.32), (20, 0.34)]]


def names(found) -> set[str]:
    return {f.name for f in found}


def test_healthy_run_has_no_flags():
    assert flags(HEALTHY, HEALTHY_EVALS, {"steps_done": 20, "status": "ok"}, 20) == []


def test_train_eval_divergence():
    evals = [{"type": "eval", "step": s, "eval/ood/greedy_pass@1": v} for s, v in [(5, 0.40), (10, 0.42), (15, 0.39), (20, 0.35)]]
    found = flags(HEALTHY, evals, {"steps_done": 20, "status": "ok"}, 20)
    assert names(found) == {"train_eval_divergence"}
    assert "0.42 -> 0.39 -> 0.35" in found[0].evidence
    flat_reward = steps_of(20, reward_mean=0.3)
    assert flags(flat_reward, evals, None, 20) == []


def test_length_collapse():
    s = steps_of(20, response_length_mean=lambda i: 200 if i < 10 else 30)
    found = flags(s, [], {"steps_done": 20, "status": "ok"}, 20)
    assert names(found) == {"length_collapse"} and "200" in found[0].evidence


def test_high_truncation_must_be_sustained():
    sustained = steps_of(12, truncated_rate=lambda i: 0.8 if i >= 4 else 0.2)
    assert names(flags(sustained, [], None, 12)) == {"high_truncation"}
    blips = steps_of(12, truncated_rate=lambda i: 0.9 if i % 3 == 0 else 0.1)
    assert flags(blips, [], None, 12) == []


def test_exit_zero_with_no_training_steps():
    found = flags([], [{"type": "eval", "step": 0, "eval/id/greedy_pass@1": 0.4}], {"steps_done": 0, "status": "ok"}, 50)
    assert names(found) == {"no_training"} and "0 of 50" in found[0].evidence
    assert flags([], [], {"steps_done": 0, "status": "ok"}, 0) == []


def test_short_run_reported_ok():
    found = flags(HEALTHY[:5], [], {"steps_done": 5, "status": "ok"}, 50)
    assert names(found) == {"short_run"}
