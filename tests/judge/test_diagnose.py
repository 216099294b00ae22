"""diagnose(): one synthetic metric stream per symptom and per bottleneck."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from autorl.errors import RulesError
from autorl.judge.diagnose import (
    OPS,
    STATS,
    bottleneck_names,
    diagnose,
    diagnose_run,
    load_rules,
    symptom_names,
)
from autorl.metrics import STEP_KEYS

N = 40
TRAIN = {"max_grad_norm": 1.0, "kl_coef": 0.5}  # healthy kl 0.01 is above 0.005 x kl_coef


def healthy(n: int = N) -> tuple[list[dict], list[dict]]:
    """A run that learns steadily: reward 0.30 -> 0.45, eval rising, nothing extreme."""
    steps = []
    for t in range(1, n + 1):
        reward = 0.3 + 0.15 * t / n + 0.01 * math.sin(1.7 * t)
        steps.append(
            {
                "type": "step",
                "step": t,
                "reward_mean": reward,
                "correctness": reward,
                "reward_std": 0.45,
                "entropy_mean": 0.8 - 0.1 * t / n,
                "response_length_mean": 3.5 + 0.05 * math.sin(t),
                "truncated_rate": 0.05,
                "grad_norm": 0.4 + 0.1 * math.sin(t),
                "kl": 0.01 + 0.002 * math.sin(t),
                "clip_ratio": 0.05,
                "frac_zero_std_groups": 0.25,
                "advantage_mean": 0.0,
                "advantage_std": 0.8,
                "advantage_abs_max": 2.5,
                "log_ratio_abs_max": 0.4,
                "log_ratio_abs_p99": 0.1,
                "ratio_max": 1.5,
                "loss": 0.02 * math.sin(t),
                "lr": 1e-4,
                "tokens_per_s": 5000.0,
                "time_generate_s": 0.016,
                "time_reward_s": 0.001,
                "time_update_s": 0.032,
            }
        )
    evals = [
        {
            "type": "eval",
            "step": s,
            "eval/id/greedy_pass@1": 0.55 + 0.004 * s,
            "eval/ood/greedy_pass@1": 0.30 + 0.002 * s,
        }
        for s in range(0, n + 1, 10)
    ]
    return steps, evals


def set_series(steps: list[dict], key: str, fn) -> None:
    for i, rec in enumerate(steps):
        rec[key] = fn(i, rec)


def set_evals(evals: list[dict], key: str, values: list[float]) -> None:
    for rec, v in zip(evals, values):
        rec[key] = v


def _flat(s, e):
    set_series(s, "reward_mean", lambda i, r: 0.31 + 0.01 * math.sin(1.7 * i))
    set_series(s, "entropy_mean", lambda i, r: 0.8)
    set_evals(e, "eval/id/greedy_pass@1", [0.554] * len(e))


def _eval_dip(s, e):
    set_evals(e, "eval/id/greedy_pass@1", [0.55, 0.38, 0.40, 0.48, 0.55])


def _kl_spike(s, e):
    set_series(s, "kl", lambda i, r: 1.0 if i == 25 else 0.01)


def _grad_spike(s, e):
    set_series(s, "grad_norm", lambda i, r: 150.0 if i == 20 else r["grad_norm"])


def _extreme_ratio(s, e):
    set_series(s, "log_ratio_abs_max", lambda i, r: 8.0 if i == 15 else r["log_ratio_abs_max"])


def _clip(s, e):
    set_series(s, "clip_ratio", lambda i, r: 0.5)


def _entropy_collapse(s, e):
    set_series(s, "entropy_mean", lambda i, r: 0.8 - 0.7 * i / N)
    set_series(s, "reward_mean", lambda i, r: 0.31 + 0.01 * math.sin(1.7 * i))  # and no learning


def _length_collapse(s, e):
    set_series(s, "response_length_mean", lambda i, r: 3.5 - 2.5 * i / N)
    set_series(s, "reward_mean", lambda i, r: 0.31 + 0.01 * math.sin(1.7 * i))  # and no learning


def _truncation(s, e):
    set_series(s, "truncated_rate", lambda i, r: 0.9)


def _zero_std(s, e):
    set_series(s, "frac_zero_std_groups", lambda i, r: 0.8)
    set_series(s, "reward_mean", lambda i, r: 0.31 + 0.01 * math.sin(1.7 * i))  # and no learning


def _kl_pinned(s, e):
    set_series(s, "kl", lambda i, r: 0.001)


def _reward_zero(s, e):
    set_series(s, "reward_mean", lambda i, r: 0.0)


def _reward_one(s, e):
    set_series(s, "reward_mean", lambda i, r: 1.0)


def _frozen(s, e):
    set_series(s, "grad_norm", lambda i, r: 0.0)


def _adv_outlier(s, e):
    set_series(s, "advantage_abs_max", lambda i, r: 50.0 if i == 30 else 2.5)


def _nan(s, e):
    set_series(s, "loss", lambda i, r: float("nan") if i == N - 1 else r["loss"])


def _nan_string(s, e):
    set_series(s, "grad_norm", lambda i, r: "nan" if i == N - 1 else r["grad_norm"])


def _hacking(s, e):
    set_evals(e, "eval/id/greedy_pass@1", [0.55, 0.56, 0.55, 0.54, 0.55])


def _ood_falls(s, e):
    set_evals(e, "eval/ood/greedy_pass@1", [0.30, 0.354, 0.33, 0.30, 0.28])


def _eval_decline(s, e):
    set_evals(e, "eval/ood/greedy_pass@1", [0.30, 0.34, 0.36, 0.33, 0.31])


def _slow_generation(s, e):
    set_series(s, "time_generate_s", lambda i, r: 0.5)


def _slow_reward(s, e):
    set_series(s, "time_reward_s", lambda i, r: 0.05)


CASES = [
    ("flat_learning", _flat, "stable_low_accuracy"),
    ("instability", _eval_dip, "unstable"),
    ("instability", _kl_spike, "unstable"),
    ("loss_grad_spikes", _grad_spike, "unstable"),
    ("extreme_ratios", _extreme_ratio, "unstable"),
    ("clip_saturation", _clip, "unstable"),
    ("entropy_collapse", _entropy_collapse, "unstable"),
    ("length_collapse", _length_collapse, "unstable"),
    ("high_truncation", _truncation, "stable_low_accuracy"),
    ("zero_std_groups", _zero_std, "stable_low_accuracy"),
    ("kl_pinned", _kl_pinned, "stable_low_accuracy"),
    ("reward_stuck", _reward_zero, None),
    ("reward_stuck", _reward_one, None),
    ("grad_vanishing", _frozen, "stable_low_accuracy"),
    ("advantage_outliers", _adv_outlier, "unstable"),
    ("nonfinite", _nan, "unstable"),
    ("nonfinite", _nan_string, "unstable"),
    ("reward_hacking", _hacking, "weak_validation"),
    ("reward_hacking", _ood_falls, "weak_validation"),
    ("eval_decline", _eval_decline, "weak_validation"),
    ("generation_bound", _slow_generation, "slow_or_idle"),
    ("reward_bound", _slow_reward, "slow_or_idle"),
]


@pytest.mark.parametrize("symptom,mutate,bottleneck", CASES, ids=[f"{c[0]}-{c[1].__name__}" for c in CASES])
def test_each_symptom_fires_on_its_stream(symptom, mutate, bottleneck):
    steps, evals = healthy()
    mutate(steps, evals)
    d = diagnose(steps, evals, TRAIN)
    assert symptom in d.names(), d.summary()
    if bottleneck:
        assert d.bottleneck == bottleneck, d.summary()
    fired = next(s for s in d.symptoms if s.name == symptom)
    assert fired.evidence and all(e.points > 0 for e in fired.evidence)


def test_healthy_stream_has_no_symptoms():
    steps, evals = healthy()
    d = diagnose(steps, evals, TRAIN)
    assert d.symptoms == [] and d.bottleneck == "none" and d.areas == []
    assert (d.steps, d.evals) == (N, 5)


def test_every_symptom_and_bottleneck_is_exercised():
    assert {c[0] for c in CASES} == set(symptom_names())
    assert {c[2] for c in CASES if c[2]} | {"none"} == set(bottleneck_names())


def test_evidence_carries_value_and_threshold():
    steps, evals = healthy()
    _truncation(steps, evals)
    ev = next(s for s in diagnose(steps, evals, TRAIN).symptoms if s.name == "high_truncation").evidence[0]
    assert ev.metric == "truncated_rate" and ev.window == "tail"
    assert ev.value == pytest.approx(0.9) and ev.threshold == pytest.approx(0.7)
    assert ev.points == math.ceil(N * 0.25)
    assert "truncated_rate" in ev.line()


def test_ood_split_pinned_at_zero_is_not_hacking():
    steps, evals = healthy()
    set_evals(evals, "eval/ood/greedy_pass@1", [0.0] * len(evals))  # too hard to carry signal
    assert diagnose(steps, evals, TRAIN).names() == set()


def test_spike_needs_a_typical_level():
    steps, evals = healthy()
    set_series(steps, "grad_norm", lambda i, r: 1.4 if i == 0 else 0.0)  # collapsed: median 0
    d = diagnose(steps, evals, TRAIN)
    assert "loss_grad_spikes" not in d.names() and "grad_vanishing" not in d.names()


def test_threshold_scales_with_recipe_key():
    steps, evals = healthy()
    set_series(steps, "grad_norm", lambda i, r: 50.0)  # constant: no spike, only the scaled rule can fire
    assert "loss_grad_spikes" not in diagnose(steps, evals, {"max_grad_norm": 1.0}).names()
    d = diagnose(steps, evals, {"max_grad_norm": 0.1})
    ev = next(s for s in d.symptoms if s.name == "loss_grad_spikes").evidence[0]
    assert ev.threshold == pytest.approx(10.0) and ev.value == 50.0


def test_missing_scale_key_skips_that_rule():
    steps, evals = healthy()
    set_series(steps, "grad_norm", lambda i, r: 500.0)
    assert "loss_grad_spikes" not in diagnose(steps, evals, {}).names()


def test_unstable_outranks_low_accuracy():
    steps, evals = healthy()
    _flat(steps, evals)
    _grad_spike(steps, evals)
    d = diagnose(steps, evals, TRAIN)
    assert {"flat_learning", "loss_grad_spikes"} <= d.names()
    assert d.bottleneck == "unstable"


def test_too_few_points_are_not_judged():
    steps, evals = healthy(n=3)
    _truncation(steps, evals)
    assert diagnose(steps, evals, TRAIN).names() == set()
    assert diagnose([], [], TRAIN).bottleneck == "none"


def test_missing_metrics_do_not_fire():
    steps = [{"step": t, "reward_mean": 0.3 + 0.01 * t} for t in range(1, 30)]
    d = diagnose(steps, [], TRAIN)
    assert d.names() == set()


def test_optional_condition_is_skipped_when_missing():
    steps = [{"step": t, "reward_mean": 0.31} for t in range(1, 30)]  # no entropy, no evals
    assert "flat_learning" in diagnose(steps, [], TRAIN).names()


def test_rules_reference_known_metrics_and_stats():
    rules = load_rules()
    for name, rule in rules.symptoms.items():
        for cond in rule.when_all + rule.when_any:
            known = cond.metric in STEP_KEYS or cond.metric in rules.derived
            known = known or (cond.metric.startswith("eval/") and cond.metric.endswith("/greedy_pass@1"))
            assert known, f"{name}: {cond.metric}"
            assert cond.stat in STATS
    for d in rules.derived.values():
        assert {d.numerator, *d.denominator} <= set(STEP_KEYS)


def test_malformed_rules_file_names_the_field(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(
        "symptoms:\n  x:\n    description: d\n    when_all:\n      - {metric: loss, stat: mean, op: bigger, threshold: 1}\n"
        "bottlenecks: []\ndefault: {name: none, description: d, areas: []}\n"
    )
    with pytest.raises(RulesError, match=r"symptoms\.x\.when_all\.0\.op"):
        load_rules(path)
    path.write_text(path.read_text().replace("op: bigger", "op: gt").replace("stat: mean", "stat: median"))
    with pytest.raises(RulesError, match="unknown stat 'median'"):
        load_rules(path)


def test_diagnose_run_reads_a_metrics_file(tmp_path):
    steps, evals = healthy()
    _grad_spike(steps, evals)
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in steps + evals) + '{"type": "step", "st')
    d = diagnose_run(path, TRAIN)
    assert d.bottleneck == "unstable" and d.steps == N and d.evals == 5


def test_import_is_light():
    code = "import sys, autorl.judge.diagnose, autorl.search.hypotheses; print(sorted(m for m in ('torch','transformers','trl','ray','optuna') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == "[]"


def test_a_smoothed_rule_does_not_judge_a_run_shorter_than_its_average():
    """A reward drop calibrated on a 10-step average is not read from 8 raw, noisy steps (a flat 8-step run)."""
    steps, evals = healthy(8)
    noisy = [0.45, 0.40, 0.47, 0.33, 0.44, 0.36, 0.46, 0.31]  # raw drop 0.16: per-step noise at 128 samples
    set_series(steps, "reward_mean", lambda i, r: noisy[i])
    assert "instability" not in diagnose(steps, evals, TRAIN).names()
    steps, evals = healthy(30)  # a real fall of the 10-step average does count
    set_series(steps, "reward_mean", lambda i, r: 0.45 if i < 15 else 0.25)
    d = diagnose(steps, evals, TRAIN)
    assert "instability" in d.names() and d.bottleneck == "unstable"


def test_a_drop_equal_to_the_threshold_in_float_is_not_beyond_it():
    """OOD 0.55 -> 0.5 is a drop of 0.050000000000000044 in float: not more than the 0.05 threshold."""
    steps, evals = healthy()
    set_series(steps, "reward_mean", lambda i, r: 0.2 + 0.3 * i / N)  # train reward rises
    set_evals(evals, "eval/ood/greedy_pass@1", [0.45, 0.55, 0.5, 0.5, 0.5])
    assert 0.55 - 0.5 > 0.05  # the float edge itself
    assert "reward_hacking" not in diagnose(steps, evals, TRAIN).names()
    set_evals(evals, "eval/ood/greedy_pass@1", [0.45, 0.55, 0.49, 0.49, 0.49])  # a real 0.06 drop still fires
    assert "reward_hacking" in diagnose(steps, evals, TRAIN).names()


def test_comparisons_hold_at_their_edges():
    assert OPS["gt"](0.05 + 1e-17, 0.05) is False and OPS["gt"](0.0501, 0.05) is True
    assert OPS["ge"](0.05 - 1e-17, 0.05) is True and OPS["le"](0.05 + 1e-17, 0.05) is True
    assert OPS["lt"](0.01 - 1e-18, 0.01) is False and OPS["abs_lt"](-0.0099, 0.01) is True
    assert OPS["lt"](5e-11, 1e-10) is True  # a tiny threshold keeps its own scale
    assert OPS["gt"](1e-300, 0.0) is True and OPS["le"](math.nan, 1.0) is False


def test_flat_learning_points_at_the_learning_rate_first():
    steps, evals = healthy()
    _flat(steps, evals)
    d = diagnose(steps, evals, TRAIN)
    flat = next(s for s in d.symptoms if s.name == "flat_learning")
    assert flat.look_at[0].startswith("learning rate: raise it")
    assert all(r.look_at for r in load_rules().symptoms.values())  # every symptom says where to look
