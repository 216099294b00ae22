"""The hypotheses strategy's moves end to end on a real workspace, ledger and proposer: the real diagnosis of
recorded engine runs (tests/data/runs: lr 5e-7 is flat, kl_coef 4 pins the policy) decides the direction;
a flat step is followed by the next step, an overshoot by a half step, a pinned KL by a weaker one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autorl.ledger import Ledger
from autorl.recipe import validate_recipe
from autorl.search.proposal import Proposal
from autorl.search.proposer import Proposer
from autorl.states import CrashAction, CrashCategory, TrialStatus, Verdict
from autorl.states import Proposer as By
from autorl.study.controller import RunOptions
from autorl.workspace import Workspace
from tests.conftest import run_cli

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs"
TRAIN = {
    "model": "builtin:tiny",
    "task": "builtin:addition",
    "lr": 5e-7,
    "kl_coef": 0.0,
    "gens": 8,
    "batch_prompts": 16,
    "steps": 16,
    "eval_every": 8,
    "seed": 0,
}
SEARCH = {
    "lr": {"low": 1e-7, "high": 1e-2, "log": True},
    "kl_coef": {"choices": [0.0, 0.04, 0.2, 1.0, 4.0]},
    "gens": {"choices": [2, 4, 8, 16]},
}


def _records(name: str) -> list[dict]:
    return [json.loads(line) for line in (RUNS / f"{name}.jsonl").read_text().splitlines()]


@pytest.fixture
def study(tmp_path):
    root = tmp_path / "ws"
    assert run_cli("init", str(root)).returncode == 0
    ws = Workspace.open(root)
    ledger = Ledger(ws.ledger_path)

    def make(train: dict, run: str):
        base = validate_recipe(
            {"backend": "embedded", "train": {**TRAIN, **train}, "search": SEARCH, "verdict": {"baseline_repeats": 3}}
        )
        sid = ledger.create_study(
            name="s",
            recipe_path="r.yaml",
            recipe="",
            base_sha="x",
            strategy="hypotheses",
            budget_s=1.0,
            optuna_study="s",
        )
        for n in (1, 2, 3):
            add(ledger, sid, n, By.BASELINE, base.train, None, 0.476, run)
        return Proposer(ws, ledger, ledger.study(study_id=sid), base, RunOptions(strategy="hypotheses")), sid

    return make, ledger


def add(ledger, sid, number, proposer, params, verdict, objective, run, **extra):
    tid = ledger.add_trial(
        study_id=sid,
        number=number,
        attempt=f"attempt-{number:02d}",
        proposer=proposer,
        params=params,
        status=TrialStatus.COMPLETE,
        verdict=verdict,
        objective=objective,
        **extra,
    )
    ledger.add_metrics(tid, _records(run))


def test_flat_learning_steps_lr_up_then_again_then_bisects_after_an_overshoot(study):
    make, ledger = study
    proposer, sid = make({}, "flat-lr5e-7")
    p = proposer.next()
    assert (p.proposer, p.hypothesis) == (By.MOVE, "h13-flat-learning")
    assert p.values == {"lr": pytest.approx(5e-6)} and "flat_learning: lr 5e-07 -> 5e-06" in p.why
    add(
        ledger,
        sid,
        4,
        By.MOVE,
        {**proposer.base.train, **p.values},
        Verdict.FLAT,
        0.48,
        "flat-lr5e-7",
        delta=0.004,
        hypothesis=p.hypothesis,
    )
    p = proposer.next()  # still flat: the next step starts from trial 4
    assert p.values == {"lr": 5e-5}  # exactly, not 4.9999999999999996e-05
    add(
        ledger,
        sid,
        5,
        By.MOVE,
        {**proposer.base.train, **p.values},
        Verdict.REGRESSED,
        0.30,
        "flat-lr5e-7",
        delta=-0.17,
        hypothesis=p.hypothesis,
    )
    p = proposer.next()  # 5e-5 overshot: half a step from trial 4, the last good point
    assert p.values == {"lr": 1.58e-5}  # 5e-6 x sqrt(10), written as a person writes it


def test_a_pinned_policy_gets_a_weaker_kl_weight(study):
    make, _ = study
    proposer, _ = make({"lr": 3e-5, "kl_coef": 4.0}, "kl-pinned")
    p = proposer.next()
    assert (p.proposer, p.hypothesis) == (By.MOVE, "h03-kl-divergence")
    assert p.values == {"kl_coef": 0.2}  # 4 x 0.1 = 0.4 snaps to the nearest smaller choice


def test_a_deliberate_repeat_keeps_the_recipe_it_is_judged_against(study):
    """A repeat built on the incumbent was judged against the baseline once its parent was dropped: a seed-only
    re-run of the incumbent then read as a big 'improvement' and was confirmed (a real 5-minute study did that)."""
    make, ledger = study
    proposer, sid = make({}, "flat-lr5e-7")
    twin = ledger.trials(sid)[0]
    p = Proposal(
        By.HYPOTHESIS,
        {"lr": 5e-5},
        "tests h09",
        "h09",
        hypothesis="h09-sequence-precision",
        optuna_study="s-h09",
        optuna_number=4,
        patch=None,
        parent=3,
    )
    again = proposer._deliberate_repeat(p, twin)
    assert (again.parent, again.hypothesis, again.optuna_number) == (3, "h09-sequence-precision", 4)
    assert again.values["lr"] == 5e-5 and again.values["seed"] >= 1 and again.slug.startswith("repeat-01-seed")


def test_a_deliberate_repeat_of_the_baseline_is_one_more_baseline_run(study):
    """Two GPU studies spent their last trials on seed-only repeats of the baseline filed under a hypothesis: each
    was judged as a candidate against the 2 baseline runs (1 df, intervals +-0.22) while adding nothing to them."""
    make, ledger = study
    proposer, sid = make({}, "flat-lr5e-7")
    twin = ledger.trials(sid)[0]
    p = Proposal(
        By.HYPOTHESIS,
        {},
        "tests h08",
        "h08",
        hypothesis="h08-batching",
        optuna_study="s-h08",
        optuna_number=2,
        patch=None,
        parent=None,
    )
    again = proposer._deliberate_repeat(p, twin)
    assert (again.proposer, again.hypothesis, again.optuna_number) == (By.BASELINE, None, 2)
    assert again.values == {"seed": 1} and "one more baseline run" in again.why  # the fixture's runs all had seed 0
    assert proposer.is_baseline(again)  # so it gets no verdict of its own and the ledger counts it a baseline run
    ledger.add_trial(
        study_id=sid,
        number=4,
        attempt="attempt-04",
        proposer=again.proposer,
        params={**proposer.base.train, **again.values},
        status=TrialStatus.COMPLETE,
        objective=0.47,
    )
    assert [r.number for r in ledger.baselines(sid)] == [1, 2, 3, 4]


def test_parallel_slots_run_baseline_repeats_until_the_baseline_is_known(study, tmp_path):
    _, ledger = study
    base = validate_recipe(
        {"backend": "embedded", "train": TRAIN, "search": SEARCH, "verdict": {"baseline_repeats": 2}}
    )
    sid = ledger.create_study(
        name="p", recipe_path="r.yaml", recipe="", base_sha="x", strategy="hypotheses", budget_s=1.0, optuna_study="p"
    )
    proposer = Proposer(
        Workspace.open(tmp_path / "ws"),
        ledger,
        ledger.study(study_id=sid),
        base,
        RunOptions(strategy="hypotheses", parallel=4),
    )
    seeds = []
    for n in range(1, 6):
        p = proposer.next()
        if p is None:
            break
        assert p.proposer == By.BASELINE
        seeds.append(p.values.get("seed", 0))
        ledger.add_trial(
            study_id=sid,
            number=n,
            attempt=f"attempt-{n:02d}",
            proposer=By.BASELINE,
            params={**base.train, **p.values},
            status=TrialStatus.RUNNING,
        )
    assert seeds == [0, 1, 2, 3]  # four slots, four seeds of the recipe as written; the fifth waits


def test_a_second_wave_of_baseline_runs_fills_every_slot(study, tmp_path):
    """Three repeats on two slots: the third baseline run gets a fourth beside it, not an idle slot (a real packed
    study on one H200 left one of its two slots empty for a whole trial there)."""
    _, ledger = study
    base = validate_recipe(
        {"backend": "embedded", "train": TRAIN, "search": SEARCH, "verdict": {"baseline_repeats": 3}}
    )
    sid = ledger.create_study(
        name="w", recipe_path="r.yaml", recipe="", base_sha="x", strategy="hypotheses", budget_s=1.0, optuna_study="w"
    )
    proposer = Proposer(
        Workspace.open(tmp_path / "ws"),
        ledger,
        ledger.study(study_id=sid),
        base,
        RunOptions(strategy="hypotheses", parallel=2),
    )
    for n in (1, 2):
        p = proposer.next()
        ledger.add_trial(
            study_id=sid,
            number=n,
            attempt=f"attempt-{n:02d}",
            proposer=By.BASELINE,
            params={**base.train, **p.values},
            status=TrialStatus.COMPLETE,
            objective=0.1 * n,
        )
    seeds = []
    for n in (3, 4):
        p = proposer.next()
        assert p is not None and p.proposer == By.BASELINE
        seeds.append(p.values["seed"])
        ledger.add_trial(
            study_id=sid,
            number=n,
            attempt=f"attempt-{n:02d}",
            proposer=By.BASELINE,
            params={**base.train, **p.values},
            status=TrialStatus.RUNNING,
        )
    assert seeds == [2, 3] and proposer.next() is None  # both slots busy with the baseline; nothing else yet


def test_an_extra_baseline_run_that_crashes_leaves_the_baseline_known(study):
    make, ledger = study
    proposer, sid = make({}, "flat-lr5e-7")  # three complete baseline runs: the recipe's repeats
    assert not proposer.baseline_failed()
    ledger.add_trial(
        study_id=sid,
        number=4,
        attempt="attempt-04",
        proposer=By.BASELINE,
        params={**proposer.base.train, "seed": 4},
        status=TrialStatus.CRASH,
        verdict=Verdict.CRASH,
    )
    assert not proposer.baseline_failed()  # the study goes on: its baseline is measured
    proposer.base.verdict.baseline_repeats = 5
    assert proposer.baseline_failed()  # a crash before the repeats are done stops it, as before


def test_a_baseline_run_lost_to_the_machine_is_replaced_while_others_may_still_complete(study):
    """Four repeats asked; three complete, one lost (after its retry) to a neighbour on the GPU: a fifth seed is
    asked for, never the lost one's; a lost run still waiting for its retry counts as one that may complete."""
    make, ledger = study
    proposer, sid = make({}, "flat-lr5e-7")
    proposer.base.verdict.baseline_repeats = 4
    ledger.add_trial(
        study_id=sid,
        number=4,
        attempt="attempt-04",
        proposer=By.BASELINE,
        status=TrialStatus.CRASH,
        params={**proposer.base.train, "seed": 3},
        verdict=Verdict.CRASH,
        crash_category=CrashCategory.SHARED_GPU,
        crash_action=CrashAction.RECORD,
    )
    assert not proposer.baseline_failed() and proposer.baseline_runs_missing() == 1
    p = proposer.next()
    assert p is not None and p.proposer == By.BASELINE and p.values == {"seed": 4}
    ledger.add_trial(
        study_id=sid,
        number=5,
        attempt="attempt-05",
        proposer=By.BASELINE,
        status=TrialStatus.CRASH,
        params={**proposer.base.train, "seed": 4},
        verdict=Verdict.CRASH,
        crash_category=CrashCategory.CUDA_OOM,
        crash_action=CrashAction.RECORD,
    )
    assert proposer.baseline_failed()  # a failure the values can cause still ends it, as before


def test_lost_runs_that_outnumber_the_ones_that_may_complete_end_the_baseline(study):
    make, ledger = study
    proposer, sid = make({}, "flat-lr5e-7")
    proposer.base.verdict.baseline_repeats = 8
    for n in range(4, 8):
        ledger.add_trial(
            study_id=sid,
            number=n,
            attempt=f"attempt-{n:02d}",
            proposer=By.BASELINE,
            status=TrialStatus.CRASH,
            params={**proposer.base.train, "seed": n - 1},
            verdict=Verdict.CRASH,
            crash_category=CrashCategory.KILLED_EXTERNAL,
            crash_action=CrashAction.RECORD,
        )
    assert proposer.baseline_failed()  # 4 lost against 3 complete
    ledger.update_trial(ledger.trial(7).id, crash_action=CrashAction.RETRY_ONCE)
    assert not proposer.baseline_failed()  # its retry is still to come: 3 lost, 3 complete, 1 that may
