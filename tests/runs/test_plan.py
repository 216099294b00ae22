"""Trial-start planning on synthetic durations: the fit, the measured margin, the hard cap (autorl.runs.plan)."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
import yaml
from conftest import run_cli

from autorl.backends.base import get_backend
from autorl.ledger import Trial
from autorl.recipe import load_recipe
from autorl.runs import plan
from autorl.runs.plan import PlanRules, Took
from autorl.states import TrialStatus
from autorl.study.controller import budget_spent

RULES = PlanRules(window=12, quantile=0.9, min_for_margin=3, first_margin=1.25, overhead_s=2.0)


def test_work_is_the_product_of_the_size_keys_present():
    assert plan.work({"steps": 40, "gens": 8, "lr": 1e-5}, ["steps", "gens", "batch_prompts"]) == 320
    assert plan.work({"steps": 40, "gens": True, "batch_prompts": "x"}, ["steps", "gens", "batch_prompts"]) == 40
    assert plan.work({}, ["steps"]) == 1.0


def test_the_shipped_table_validates_and_the_default_recipes_backend_names_its_size_keys():
    assert plan.rules().window >= 1
    assert {"steps", "gens", "batch_prompts"} <= set(get_backend("embedded").work_keys)
    with pytest.raises(ValueError):
        PlanRules.model_validate({**RULES.model_dump(), "typo": 1})


def test_before_any_trial_the_timeout_or_half_the_budget_plans_a_start():
    assert plan.expected([], 320, timeout_s=60, budget_s=600, r=RULES).seconds == 60
    assert plan.expected([], 320, timeout_s=60, budget_s=90, r=RULES).seconds == 45


def test_one_large_trial_does_not_inflate_the_plan_for_the_small_ones():
    """Eight trials at gens 8 (10 s) and one at gens 16 (20 s): the next gens-8 trial is planned at 10 s + overhead,
    where the longest recent trial x 1.25 + 2 s would have reserved 27 s."""
    history = [Took(320, 10.0)] * 8 + [Took(640, 20.0)]
    est = plan.expected(history, 320, timeout_s=120, budget_s=300, r=RULES)
    assert est.predicted == pytest.approx(10.0) and est.margin == pytest.approx(1.0)
    assert est.seconds == pytest.approx(12.0)
    assert plan.expected(history, 640, timeout_s=120, budget_s=300, r=RULES).seconds == pytest.approx(22.0)


def test_an_affine_history_is_fitted_exactly_with_its_fixed_part():
    history = [Took(w, 4.0 + 0.05 * w) for w in (80, 160, 320, 160, 80)]
    fixed, per = plan.fit(history)
    assert fixed == pytest.approx(4.0) and per == pytest.approx(0.05)
    assert plan.predict(history, 240) == pytest.approx(16.0)


def test_one_work_level_never_plans_a_smaller_trial_shorter_and_scales_a_larger_one_up():
    history = [Took(320, 9.0), Took(320, 11.0)]
    assert plan.predict(history, 160) == pytest.approx(10.0)
    assert plan.predict(history, 640) == pytest.approx(20.0)


def test_beyond_the_largest_work_seen_the_plan_grows_in_proportion():
    history = [Took(w, 4.0 + 0.05 * w) for w in (80, 160)]
    assert plan.predict(history, 320) == pytest.approx(12.0 * 2)


def test_the_margin_is_a_high_quantile_of_the_leave_one_out_ratios():
    history = [Took(320, 10.0)] * 4 + [Took(320, 13.0)]
    # the 13 s trial predicted from the others: 10 s, ratio 1.3; each 10 s trial: 43/4 s, ratio < 1
    assert plan.margin(history, RULES) == pytest.approx(1.3)
    est = plan.expected(history, 320, timeout_s=120, budget_s=300, r=RULES)
    assert est.seconds == pytest.approx(10.6 * 1.3 + 2.0)


def test_with_many_trials_the_quantile_drops_the_single_worst_ratio():
    history = [Took(320, 10.0)] * 10 + [Took(320, 12.0), Took(320, 30.0)]
    m = plan.margin(history, RULES)
    assert 1.0 < m < 1.3  # the 30 s outlier (one in twelve) sits above the 90th percentile


def test_fewer_trials_than_needed_for_a_margin_take_the_first_margin():
    assert plan.margin([Took(320, 10.0), Took(320, 20.0)], RULES) == 1.25


def test_durations_falling_with_work_fall_back_to_their_mean():
    history = [Took(160, 12.0), Took(320, 10.0), Took(640, 8.0)]
    assert plan.fit(history) == (pytest.approx(10.0), 0.0)


def test_only_the_window_of_recent_trials_plans_and_timeout_stays_the_cap():
    r = RULES.model_copy(update={"window": 3})
    history = [Took(320, 100.0)] * 5 + [Took(320, 10.0)] * 3
    assert plan.expected(history, 320, timeout_s=120, budget_s=600, r=r).seconds == pytest.approx(12.0)
    assert plan.expected([Took(320, 500.0)] * 3, 320, timeout_s=60, budget_s=600, r=r).seconds == 60


def test_the_first_trial_alone_plans_without_a_margin_on_its_one_time_start_up():
    """An 8-minute GPU study ended after its baseline with 4 minutes left: the baseline's 3.7 minutes, one-time
    start-up included, times the first margin. Its own duration is the plan now."""
    est = plan.expected([Took(320, 220.0, first=True)], 320, timeout_s=600, budget_s=480, r=RULES)
    assert est.first_only and est.margin == 1.0
    assert est.seconds == pytest.approx(220.0 + RULES.overhead_s)
    assert "first trial" in est.describe()


def test_the_first_trial_plans_nothing_once_later_trials_finished():
    history = [Took(320, 220.0, first=True), Took(320, 120.0), Took(320, 130.0), Took(320, 125.0)]
    est = plan.expected(history, 320, timeout_s=600, budget_s=3600, r=RULES)
    assert not est.first_only and est.basis == 3
    assert est.predicted == pytest.approx(125.0)  # the mean of the later three, not dragged up by the first


def test_start_up_stays_fixed_and_only_the_rest_scales_with_work():
    """A 2-GPU study ended with 2m12s left: one finished trial of 214 s (about 155 s of it start-up) at 8 samples
    per prompt planned the next at 16 as 429 s, the whole trial doubled. Start-up does not grow with the work."""
    seen = [Took(8, 214.0, startup=155.0)]
    assert plan.predict(seen, 16) == pytest.approx(155.0 + 2 * 59.0)
    assert plan.predict([Took(8, 214.0)], 16) == pytest.approx(428.0)  # without a start-up: all of it scales
    mixed = [Took(8, 150.0, startup=90.0), Took(8, 160.0)]  # a trial without one: the plain fit, as before
    assert plan.predict(mixed, 16) == pytest.approx(310.0)
    assert plan.predict([Took(8, 150.0, startup=90.0), Took(16, 210.0, startup=92.0)], 12) == pytest.approx(
        91.0 + 60.0 + (118.0 - 60.0) / 8 * 4
    )


def test_history_marks_every_trial_started_before_the_first_end_as_cold():
    done = TrialStatus.COMPLETE
    rows = [
        Trial(number=1, started=0.0, finished=200.0, first_step=150.0, status=done, params={"gens": 8}),
        Trial(number=2, started=1.0, finished=210.0, status=done, params={"gens": 8}),
        Trial(number=3, started=205.0, finished=300.0, first_step=260.0, status=done, params={"gens": 16}),
        Trial(number=4, started=211.0, finished=250.0, status=TrialStatus.CRASH, params={}),
        Trial(number=5, started=301.0, status=TrialStatus.RUNNING),
    ]
    took = plan.history(list(reversed(rows)), ["gens"])
    assert [t.first for t in took] == [True, True, False]
    assert [t.startup for t in took] == [150.0, None, 55.0] and [t.work for t in took] == [8, 8, 16]
    assert plan.history([], ["gens"]) == []


def test_a_trial_that_built_a_warm_pool_counts_as_cold_whenever_it_ran():
    """A pool built mid-study (after a failure retired the last one) paid the start-up its later trials skip."""
    done = TrialStatus.COMPLETE
    rows = [
        Trial(number=1, started=0.0, finished=150.0, status=done, warm_pool="warm-a", warm_index=0),
        Trial(number=2, started=151.0, finished=231.0, status=done, warm_pool="warm-a", warm_index=1),
        Trial(number=3, started=232.0, finished=380.0, status=done, warm_pool="warm-b", warm_index=0),
        Trial(number=4, started=381.0, finished=460.0, status=done, warm_pool="warm-b", warm_index=1),
        Trial(number=5, started=461.0, finished=600.0, status=done),  # a job of its own: steady, as before
    ]
    assert [t.first for t in plan.history(rows, ["gens"])] == [True, False, True, False, False]


def test_a_budget_spent_on_the_backends_first_preparation_says_so_and_what_to_do():
    """A fresh workspace's base model took 212 s of a 2-minute budget: the study ended with 0 trials and only 'the
    budget is spent'. Now the line names the preparation; a study that ran trials, or prepared quickly, does not."""
    line = budget_spent(212.4, 120.0, "embedded", 0)
    assert line.startswith("the budget is spent: preparing backend embedded took 212 s of 2m")
    assert "`autorl run --resume`" in line
    assert budget_spent(212.4, 120.0, "embedded", 1) == "the budget is spent"
    assert budget_spent(20.0, 600.0, "embedded", 0) == "the budget is spent"


def test_a_trial_that_does_more_work_gets_a_proportionally_longer_timeout():
    """The recipe's timeout_s is for the recipe as written: the SmolLM2 recipe's 600 s at gens 8 becomes 2,400 s for
    a gens-32 trial (its warm run took 512 s, a cold one about 690 s), stays 600 s for a change of lr, and never
    shrinks below it for a smaller trial."""
    base = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "openrlhf-smollm2.yaml")
    backend = get_backend("openrlhf")
    assert base.timeout_s == 600
    assert backend.trial_timeout(base, {"gens": 32, "lr": 1e-5}) == 2400
    assert backend.trial_timeout(base, {"lr": 1e-5, "eps_clip": 0.3}) == 600
    assert backend.trial_timeout(base, {"gens": 4}) == 600
    assert backend.trial_timeout(base, {"gens": 11, "max_new_tokens": 80}) == pytest.approx(600 * 11 / 8 * 2)


@pytest.mark.slow
def test_a_study_gives_a_trial_with_four_times_the_steps_four_times_the_timeout(command_ws):
    """A baseline of 2 steps under a 3 s timeout, and a trial of 8 steps that needs about 6 s: it completes."""
    script = Path(__file__).resolve().parents[1] / "data" / "scripts" / "write_jsonl.py"
    argv = [sys.executable, str(script), "--lr", "{lr}", "--steps", "{steps}", "--out", "{run_dir}/metrics.jsonl"]
    recipe = {
        "name": "longer",
        "backend": "command",
        "train": {"argv": [*argv, "--sleep-per-step", "0.7"], "lr": 1e-4, "steps": 2},
        "search": {"steps": {"choices": [2, 8]}},
        "objective": {"metric": "reward_mean", "direction": "maximize"},
        "verdict": {"baseline_repeats": 1},
        "timeout_s": 3,
    }
    (command_ws / "recipes" / "longer.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    r = run_cli(
        "-C",
        str(command_ws),
        "run",
        "recipes/longer.yaml",
        "--budget",
        "5m",
        "--max-trials",
        "2",
        "--strategy",
        "random",
        "--allow-overrun",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr + r.stdout
    rows = (
        sqlite3.connect(command_ws / "ledger.sqlite")
        .execute("SELECT number, status, finished - started FROM autorl_trials ORDER BY number")
        .fetchall()
    )
    assert [(n, status) for n, status, _ in rows] == [(1, "complete"), (2, "complete")], rows
    assert rows[1][2] > 3  # longer than the recipe's own timeout


def test_a_trial_of_a_resumed_session_is_planned_with_the_cold_start_up_it_will_pay():
    """Four pool-building trials (212 s to their first step, 510 s in all) and four warm ones (30 s, 350 s): the
    next trial is planned at the warm figure, unless nothing has run in this session yet; then the cold trials'
    extra 182 s of start-up is added."""
    history = [Took(8.0, 510.0, True, 212.0)] * 4 + [Took(8.0, 350.0, False, 30.0)] * 4
    warm, cold = plan.expected(history, 8.0, 2400, 3600), plan.expected(history, 8.0, 2400, 3600, cold=True)
    assert cold.seconds - warm.seconds == pytest.approx(182.0)
    assert cold.cold_s == pytest.approx(182.0) and "182 s cold start-up" in cold.describe()
    assert plan.cold_extra([Took(8.0, 350.0, False, 30.0)] * 4) == 0.0  # nothing cold seen: nothing added
