"""check_abort(): one synthetic step stream per rule, and healthy streams that must not trip."""

from __future__ import annotations

import math

import pytest

from autorl.errors import RulesError
from autorl.judge.abort import RULES_PATH, check_abort, load_window_rules
from autorl.recipe import AbortRules

RULES = AbortRules(window=4)
MAX_GRAD_NORM = 1.0


def healthy_row(i: int) -> dict:
    """A learning step: rewards mixed, some groups with signal, small clipping."""
    return {
        "type": "step",
        "step": i + 1,
        "reward_mean": 0.3 + 0.01 * i,
        "grad_norm": 0.5 + 0.05 * (i % 3),
        "frac_zero_std_groups": 0.4,
        "truncated_rate": 0.1,
        "clip_ratio": 0.05,
        "loss": 0.01,
        "kl": 0.002,
    }


def stream(n: int, **override) -> list[dict]:
    rows = []
    for i in range(n):
        row = healthy_row(i)
        row.update({k: (f(i) if callable(f) else f) for k, f in override.items()})
        rows.append(row)
    return rows


@pytest.mark.parametrize(
    "rule,override",
    [
        ("reward_stuck_zero", {"reward_mean": 0.0, "frac_zero_std_groups": 1.0}),
        ("reward_stuck_one", {"reward_mean": 1.0}),
        ("grad_norm_zero", {"grad_norm": 0.0}),
        ("zero_std_groups", {"frac_zero_std_groups": 1.0}),
        ("truncation", {"truncated_rate": 0.9}),
        ("clip_ratio", {"clip_ratio": 0.6}),
    ],
)
def test_window_rule_trips_once_the_window_is_full(rule, override):
    assert check_abort(stream(RULES.window - 1, **override), RULES, MAX_GRAD_NORM) is None
    d = check_abort(stream(RULES.window, **override), RULES, MAX_GRAD_NORM)
    assert d is not None and d.rule == rule
    assert d.step == RULES.window and len(d.values) == RULES.window and d.reason


def test_every_window_rule_is_tested():
    names = {r.name for r in load_window_rules()}
    assert names == {
        "reward_collapse",
        "reward_stuck_zero",
        "reward_stuck_one",
        "grad_norm_zero",
        "zero_std_groups",
        "truncation",
        "clip_ratio",
    }


def test_window_rules_need_every_step_of_the_window():
    # stuck for 3 of the first 4 steps, then recovering: not stuck "over the window"
    s = stream(10, reward_mean=lambda i: 0.0 if i != 2 else 0.125)
    assert check_abort(s, RULES, MAX_GRAD_NORM) is None
    # a bad stretch after the start does not count for rules defined "from the start"
    late = stream(10, clip_ratio=lambda i: 0.9 if i >= 4 else 0.05)
    assert check_abort(late, RULES, MAX_GRAD_NORM) is None


def test_thresholds_come_from_the_recipe():
    s = stream(4, truncated_rate=0.6)
    assert check_abort(s, RULES, MAX_GRAD_NORM).rule == "truncation"
    assert check_abort(s, AbortRules(window=4, truncated_rate=0.7), MAX_GRAD_NORM) is None


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "nan"])
def test_nonfinite_value_trips_immediately(value):
    s = stream(2)
    s[1]["loss"] = value
    d = check_abort(s, RULES, MAX_GRAD_NORM)
    assert d.rule == "nonfinite" and d.step == 2 and "loss" in d.reason


def test_grad_explosion_needs_a_sustained_run_after_step_one():
    big = 100.0 * MAX_GRAD_NORM
    s = stream(RULES.window + 1, grad_norm=lambda i: big * 3)
    d = check_abort(s, RULES, MAX_GRAD_NORM)
    assert d.rule == "grad_explosion" and d.step == RULES.window + 1 and d.values == [big * 3] * RULES.window
    # step 1 is excluded: the same stream one step shorter does not trip
    assert check_abort(s[:-1], RULES, MAX_GRAD_NORM) is None
    # isolated spikes (seed 004: 100-400x spikes in runs that kept learning) do not trip
    spiky = stream(30, grad_norm=lambda i: big * 4 if i % 3 == 0 else 0.5)
    assert check_abort(spiky, RULES, MAX_GRAD_NORM) is None
    # without a max_grad_norm the rule cannot be evaluated
    assert check_abort(s, RULES, None) is None


@pytest.mark.parametrize("n", [1, 4, 50])
def test_healthy_streams_never_trip(n):
    assert check_abort(stream(n), RULES, MAX_GRAD_NORM) is None
    assert check_abort(stream(n), AbortRules(), MAX_GRAD_NORM) is None


def test_healthy_edge_values_do_not_trip():
    # exactly at the thresholds (rules use strict '>'), rewards near but not at 0, missing keys
    s = stream(8, truncated_rate=0.5, clip_ratio=0.4, reward_mean=1e-3, frac_zero_std_groups=0.99)
    assert check_abort(s, RULES, MAX_GRAD_NORM) is None
    bare = [{"type": "step", "step": i + 1, "loss": 0.1} for i in range(8)]
    assert check_abort(bare, RULES, MAX_GRAD_NORM) is None


def test_disabled_rules_never_trip():
    assert check_abort(stream(4, reward_mean=0.0), AbortRules(enabled=False, window=4), MAX_GRAD_NORM) is None
    assert check_abort([], RULES, MAX_GRAD_NORM) is None


def test_collapse_after_the_first_update_is_caught():
    """lr far too high: step 1 looks healthy (sampled before any update), then reward, grads and groups die."""
    rules = AbortRules(window=4)
    steps = [{"step": 1, "reward_mean": 0.31, "grad_norm": 2.05, "frac_zero_std_groups": 0.3}]
    steps += [{"step": k, "reward_mean": 0.0, "grad_norm": 0.0, "frac_zero_std_groups": 1.0} for k in range(2, 6)]
    d = check_abort(steps, rules, max_grad_norm=1.0)
    assert d is not None and d.rule == "reward_collapse" and d.step == 4  # collapse_window 3 after step 1
    assert "fell from 0.31 at step 1" in d.reason and d.values == [0.0, 0.0, 0.0]
    assert check_abort(steps[:3], rules, max_grad_norm=1.0) is None  # not yet a full window
    low = [{**steps[0], "reward_mean": 0.1}, *steps[1:]]  # step 1 below collapse_from: only the stuck rule
    d = check_abort(low, rules, max_grad_norm=1.0)
    assert d is not None and d.rule == "reward_stuck_zero" and d.step == 5


def test_a_collapse_later_in_the_run_is_caught_and_a_short_dip_is_not():
    rules = AbortRules(window=4)
    dead = stream(
        13, reward_mean=lambda i: 0.0 if i >= 10 else 0.3, frac_zero_std_groups=lambda i: 1.0 if i >= 10 else 0.4
    )
    d = check_abort(dead, rules, MAX_GRAD_NORM)
    assert d is not None and (d.rule, d.step) == ("reward_collapse", 13)
    assert check_abort(dead[:12], rules, MAX_GRAD_NORM) is None
    dip = stream(14, reward_mean=lambda i: 0.0 if i in (5, 6, 9, 10) else 0.3)  # never 3 in a row
    assert check_abort(dip, rules, MAX_GRAD_NORM) is None
    assert check_abort(dead, AbortRules(window=4, collapse_window=4), MAX_GRAD_NORM) is None  # the window is data


def test_a_sparse_reward_that_starts_low_is_not_a_collapse():
    """A hard task: a few correct samples at step 1, then zero-reward batches: not a collapse (no level to lose)."""
    rules = AbortRules(window=8)
    sparse = stream(12, reward_mean=lambda i: 0.05 if i in (0, 7) else 0.0)
    assert check_abort(sparse, rules, MAX_GRAD_NORM) is None


def test_the_window_rules_are_data_and_a_bad_table_is_one_clear_error(tmp_path):
    assert [r.name for r in load_window_rules(RULES_PATH)] == [r.name for r in load_window_rules()]
    bad = tmp_path / "abort.yaml"
    bad.write_text("rules:\n  - {name: x, metric: reward_mean, op: gt, limit: no_such_threshold, reason: r}\n")
    with pytest.raises(RulesError, match="no_such_threshold"):
        load_window_rules(bad)
    bad.write_text(
        "rules:\n  - {name: x, metric: reward_mean, op: gt, limit: 1, start: any, window: no_window, reason: r}\n"
    )
    with pytest.raises(RulesError, match="no_window"):
        load_window_rules(bad)
    bad.write_text("rules:\n  - {name: x, metric: reward_mean, op: between, limit: 1, reason: r}\n")
    with pytest.raises(RulesError, match="abort rules"):
        load_window_rules(bad)
