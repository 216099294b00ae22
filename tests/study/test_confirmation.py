"""Candidates and confirmation in the ledger: the migration's columns, the named queries, and who may use a
candidate (the incumbent, a hypothesis' status, promote's pick) only once fresh-seed re-runs confirmed it."""

from __future__ import annotations

import pytest

from autorl.backends.base import get_backend
from autorl.errors import NotFoundError
from autorl.judge.evidence import incumbent_row
from autorl.judge.result import TrialResult
from autorl.ledger import Ledger, Trial
from autorl.promote.promotion import pick_best
from autorl.recipe import validate_recipe
from autorl.search.hypotheses import counted_verdict
from autorl.states import Confirmation, CrashAction, Proposer, TrialStatus, Verdict


@pytest.fixture
def ledger(tmp_path):
    led = Ledger(tmp_path / "ledger.sqlite")
    sid = led.create_study(
        name="s", recipe_path="r.yaml", recipe="", base_sha="x", strategy="random", budget_s=1.0, optuna_study="s"
    )
    rows = [
        (1, Proposer.BASELINE, None, None, None, 0.50),
        (2, Proposer.RANDOM, Verdict.IMPROVED, Confirmation.CONFIRMED, None, 0.60),
        (3, Proposer.RANDOM, Verdict.IMPROVED, Confirmation.CANDIDATE, None, 0.70),
        (4, Proposer.CONFIRM, None, None, 3, 0.52),
        (5, Proposer.RANDOM, Verdict.IMPROVED, Confirmation.REJECTED, None, 0.65),
        (6, Proposer.RANDOM, Verdict.FLAT, None, None, 0.55),
    ]
    for number, proposer, verdict, state, confirms, objective in rows:
        led.add_trial(
            study_id=sid,
            number=number,
            attempt=f"attempt-{number:02d}",
            proposer=proposer,
            status=TrialStatus.COMPLETE,
            verdict=verdict,
            confirmation=state,
            confirms=confirms,
            objective=objective,
            delta=objective - 0.5,
            ci_low=objective - 0.55,
            ci_high=objective - 0.45,
        )
    return led


def test_named_queries(ledger):
    records = ledger.records(ledger.study().id)
    assert [t.number for t in records.confirmed()] == [2]
    assert [t.number for t in records.confirm_runs(3)] == [4]
    assert list(records.confirm_groups()) == [3]
    ledger.set_confirmation(3, Confirmation.REJECTED, "2 fresh-seed runs: flat")
    row = ledger.trial(3)
    assert row.confirmation == Confirmation.REJECTED and row.reason.endswith("rejected: 2 fresh-seed runs: flat")


def test_promote_offers_only_confirmed_without_force(ledger):
    best, why = pick_best(ledger)
    assert best.number == 2 and "confirmed" in why
    ledger.set_confirmation(2, Confirmation.REJECTED, "re-check")
    with pytest.raises(NotFoundError, match=r"1 candidates await confirmation\): `autorl run --resume --study "):
        pick_best(ledger)
    forced, why = pick_best(ledger, force=True)
    assert forced.number == 3 and "--force" in why


def test_incumbent_is_the_best_confirmed_not_the_best_candidate(ledger):
    trials = ledger.trials()
    best = incumbent_row(trials, "maximize")
    assert best is not None and best.number == 2  # 3 and 5 score higher but are not confirmed
    assert incumbent_row([t for t in trials if t.number != 2], "maximize") is None


def test_hypotheses_count_improvements_only_once_confirmed():
    improved = Trial(verdict=Verdict.IMPROVED)
    assert counted_verdict(improved.replace(confirmation=Confirmation.CONFIRMED)) == Verdict.IMPROVED
    assert counted_verdict(improved.replace(confirmation=Confirmation.CANDIDATE)) is None  # still open
    assert counted_verdict(improved.replace(confirmation=Confirmation.REJECTED)) == Verdict.FLAT
    assert counted_verdict(improved) == Verdict.IMPROVED  # ledgers from before confirmation
    assert counted_verdict(Trial(verdict=Verdict.REGRESSED)) == Verdict.REGRESSED


def test_a_trial_changing_the_generation_limit_keeps_the_study_eval_limit():
    base = validate_recipe({"backend": "embedded", "train": {"max_new_tokens": 5}}, source="t")
    embedded = get_backend("embedded")
    assert embedded.trial_values({"max_new_tokens": 8}, base) == {"max_new_tokens": 8, "eval_max_new_tokens": 5}
    assert embedded.trial_values({"lr": 1e-4}, base) == {"lr": 1e-4}
    pinned = base.with_train(eval_max_new_tokens=5)
    assert embedded.trial_values({"max_new_tokens": 8}, pinned) == {"max_new_tokens": 8}


def test_closing_a_trial_keeps_the_links_set_when_it_opened(tmp_path):
    led = Ledger(tmp_path / "ledger.sqlite")
    sid = led.create_study(
        name="s", recipe_path="r.yaml", recipe="", base_sha="x", strategy="random", budget_s=1.0, optuna_study="s"
    )
    tid = led.add_trial(study_id=sid, number=5, attempt="attempt-05", proposer=Proposer.CONFIRM, parent=2, confirms=4)
    result = TrialResult(number=5, status=TrialStatus.COMPLETE, finished=1.0, duration_s=1.0, objective=0.5)
    led.update_trial(tid, **result.ledger_values())
    row = led.trial(5)
    assert (row.parent, row.confirms, row.objective) == (2, 4, 0.5)
    assert [t.number for t in led.records(sid).confirm_runs(4)] == [5]


def test_runs_the_controller_stopped_early_do_not_count_as_run(tmp_path):
    """What resume re-queues: a confirmation run or retry that was interrupted or cut by the budget did not run."""
    led = Ledger(tmp_path / "ledger.sqlite")
    sid = led.create_study(
        name="s", recipe_path="r.yaml", recipe="", base_sha="x", strategy="random", budget_s=1.0, optuna_study="s"
    )
    rows = [
        (1, Proposer.BASELINE, TrialStatus.COMPLETE, {}),
        (2, Proposer.RANDOM, TrialStatus.COMPLETE, {"confirmation": Confirmation.CANDIDATE}),
        (3, Proposer.CONFIRM, TrialStatus.COMPLETE, {"confirms": 2}),
        (4, Proposer.CONFIRM, TrialStatus.INTERRUPTED, {"confirms": 2}),
        (5, Proposer.RANDOM, TrialStatus.CRASH, {"crash_action": CrashAction.RETRY_ONCE}),
        (6, Proposer.RETRY, TrialStatus.BUDGET_CUT, {"retry_of": 5}),
        (7, Proposer.RANDOM, TrialStatus.CRASH, {"crash_action": CrashAction.RETRY_ONCE}),
        (8, Proposer.RETRY, TrialStatus.CRASH, {"retry_of": 7}),
        (9, Proposer.CONFIRM, TrialStatus.CRASH, {"confirms": 2}),
    ]
    for number, proposer, status, extra in rows:
        led.add_trial(
            study_id=sid, number=number, attempt=f"attempt-{number:02d}", proposer=proposer, status=status, **extra
        )
    records = led.records(sid)
    assert [t.number for t in records.confirm_runs(2)] == [3, 4, 9]
    assert [t.number for t in records.confirm_runs(2, ran=True)] == [3, 9]  # a crash is an outcome
    assert [t.number for t in records.open_candidates()] == [2]
    assert [t.number for t in records.unretried_crashes()] == [5]  # 7's retry ran; 8 is itself a retry
    records.set_base_changes({"micro_batch": 4}, "the study's base recipe now has micro_batch=4")
    assert led.study(study_id=sid).base_changes == {"micro_batch": 4}
    assert led.events(sid, limit=1)[0].kind == "base-recipe"
