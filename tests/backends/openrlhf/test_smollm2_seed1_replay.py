"""SmolLM2-135M-Instruct on real OpenRLHF 0.10.4, search seed 1, in warm pools on one H200, replayed on the CPU
(tests/data/openrlhf-0.10.4/smollm2/h200-warm-seed1; its README says what ran).

The second search seed of `recipes/openrlhf-smollm2.yaml`: 20 minutes booked, four baseline runs, four candidates
(two of them lr alone at 9.4e-6 and 1.22e-5, two with more samples per prompt), and the budget spent before any
candidate's fresh-seed runs: the first wave's cold start took 212 s a trial where seed 0's took 152 s.
"""

from __future__ import annotations

import gzip
import json
import shutil
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from autorl.backends.base import get_backend
from autorl.backends.openrlhf.phases import phases, read_times, start_up
from autorl.data import shipped
from autorl.judge.abort import check_abort
from autorl.judge.diagnose import diagnose
from autorl.ledger import Ledger, open_read
from autorl.recipe import load_recipe
from autorl.runs import plan
from autorl.search.queue import RunQueue
from autorl.search.strategies import OptunaStrategy
from autorl.search.view import StudyView
from autorl.states import Confirmation, Proposer
from autorl.workspace import Workspace
from tests.conftest import run_cli, stored_study

RUN = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4" / "smollm2" / "h200-warm-seed1"
RUNS = sorted((RUN / "runs").iterdir())


@pytest.fixture(scope="module")
def trials(tmp_path_factory) -> dict[int, Any]:
    return stored_study(RUN / "study-ledger.sqlite", tmp_path_factory.mktemp("seed1"))[0]


@pytest.fixture()
def ws(tmp_path) -> Workspace:
    assert run_cli("init", str(tmp_path / "ws")).returncode == 0
    shutil.copy(RUN / "study-ledger.sqlite", tmp_path / "ws" / "ledger.sqlite")
    return Workspace.open(tmp_path / "ws")


def _queue(ws: Workspace, ledger: Ledger, recipe) -> tuple:
    """The study's rows and a run queue over them, as the study's proposer builds it."""
    study = ledger.study()
    records = ledger.records(study.id)
    view = StudyView(ws, records, study, recipe)
    return records, RunQueue(records, view, get_backend("openrlhf"), OptunaStrategy(view))


def test_four_candidates_and_a_budget_spent_before_their_fresh_seed_runs(trials, ws):
    baselines = sorted(t.objective for t in trials.values() if t.proposer == Proposer.BASELINE)
    assert baselines == [0.236, 0.244, 0.244, 0.252]  # seed 0's study: 0.240-0.254
    assert {n: round(t.objective, 3) for n, t in trials.items() if n > 4} == {5: 0.37, 6: 0.342, 7: 0.648, 8: 0.79}
    assert all(trials[n].confirmation == Confirmation.CANDIDATE for n in (5, 6, 7, 8))
    log = (RUN / "study.log").read_text()
    assert "8 trials in 1071 s" in log and "more than\n  the 2m34s left of the budget" in log
    r = run_cli("-C", str(ws.root), "status", "--json")
    found = json.loads(r.stdout)["findings"]
    assert found["confirmed"] == [] and found["open_candidates"] == [5, 6, 7, 8]
    assert found["next"]["command"].startswith("autorl run --resume")


def test_a_resume_confirms_the_strongest_candidate_first(ws):
    """The study queued 06's runs first (the first candidate judged, and the weakest: +0.098 [+0.054, +0.142]). A
    resume with room for one wave of four runs would have spent it on 05 and 06; it now starts with 08 (+0.546
    [+0.493, +0.599]), all three of its runs together, then 07, 05, 06."""
    recipe = load_recipe(RUN / "recipe.yaml")
    with closing(Ledger(ws.ledger_path)) as ledger:
        records, queue = _queue(ws, ledger, recipe)
        order = [p.confirms for p in queue.requeue()]
    assert order == [8, 8, 8, 7, 7, 7, 5, 5, 5, 6, 6, 6]


def test_each_trial_is_judged_on_its_own_per_item_eval(trials):
    assert len(RUNS) == 8
    for run in RUNS:
        record = json.loads((run / "eval.jsonl").read_text().splitlines()[-1])
        items = record["eval/id/items"]
        assert len(items) == 500 and record["eval/id/greedy_pass@1"] == pytest.approx(sum(items) / 500)
        assert trials[int(run.name[8:10])].objective == pytest.approx(record["eval/id/greedy_pass@1"])


def test_every_trial_ran_in_a_warm_pool_and_the_second_wave_started_in_half_a_minute(trials):
    for run in RUNS:
        warm = json.loads((run / "warm.json").read_text())
        t = trials[int(run.name[8:10])]
        assert (t.warm_pool, t.warm_index) == (warm["pool"], warm["index"])
        assert warm["index"] == (0 if t.number <= 4 else 1)
    table = (RUN / "phases.md").read_text()
    assert "| start-up (submit to first step) | 212 s | 212 s | 211 s | 212 s | 31 s | 30 s | 28 s | 33 s |" in table
    text = gzip.open(RUN / "runs" / "attempt-07-h13-lr-1-51em05-gens-11" / "train.log.gz", "rt").read()
    times = read_times(RUN / "runs" / "attempt-07-h13-lr-1-51em05-gens-11" / "train.log.times")
    p = phases(text, times, times[0][1], times[-1][1])
    assert p["vllm"] < 2 and start_up(p) < 40 and p["training"] > 200


def test_the_rules_tuned_on_tiny_models_hold_on_this_seed_too(trials, tmp_path):
    """No early-abort rule fires on any trial, and the trials that learned most (07: gens 11 and lr 1.5e-5, 0.648;
    08: gens 32 and lr 1e-5, 0.790) read as healthy, not as a collapse of length or entropy."""
    recipe = load_recipe(RUN / "recipe.yaml")
    assert recipe.model_dump() == load_recipe(shipped("recipes", "openrlhf-smollm2.yaml")).model_dump()
    path = Path(shutil.copy(RUN / "study-ledger.sqlite", tmp_path / "ledger.sqlite"))
    with closing(open_read(path)) as ledger:
        for number, t in trials.items():
            records = ledger.metrics(t.id)
            steps = [r for r in records if r.get("type") == "step"]
            evals = [r for r in records if r.get("type") == "eval"]
            assert len(steps) == 16 and evals, number
            assert check_abort(steps, recipe.abort, get_backend("openrlhf").max_grad_norm(recipe)) is None, number
            if number in (7, 8):
                d = diagnose(steps, evals, recipe.train)
                assert d.bottleneck == "none" and not d.names(), (number, d.summary())


def test_a_live_study_queues_a_stronger_candidate_before_a_weaker_one_not_started(ws):
    """In the order the study judged them (06, 05, 07, 08), each candidate's three runs go in front of any weaker
    candidate whose runs have not started; a candidate with a run under way keeps its place."""
    recipe = load_recipe(RUN / "recipe.yaml")
    with closing(Ledger(ws.ledger_path)) as ledger:
        records, queue = _queue(ws, ledger, recipe)
        runs = recipe.verdict.confirm_runs
        for number in (6, 5):
            queue.confirmation_runs(queue._proposal_of(records.trial(number)), number, runs)
        assert [p.confirms for p in queue.pending] == [5, 5, 5, 6, 6, 6]
        queue.pending.pop(0)  # 05's first run starts
        for number in (7, 8):
            queue.confirmation_runs(queue._proposal_of(records.trial(number)), number, runs)
        assert [p.confirms for p in queue.pending] == [5, 5, 8, 8, 8, 7, 7, 7, 6, 6, 6]


def test_a_resume_plans_the_cold_confirmation_runs_it_will_pay_for(ws):
    """08's fresh-seed run (gens 32) on a resume starts cold: its plan is the warm trials' fit for gens 32 plus the
    pools' 182 s of extra start-up, above the recipe's 600 s (set for gens 8) and under the 2,400 s its work gives
    it, so a resume with less than that left does not start a run the budget would cut."""
    recipe = load_recipe(RUN / "recipe.yaml")
    backend = get_backend("openrlhf")
    with closing(Ledger(ws.ledger_path)) as ledger:
        records = ledger.records(ledger.study().id)
        took = plan.history(records.finished(last=20), backend.work_keys, first_end=records.first_end())
    values = {**recipe.train, "gens": 32, "lr": 1e-5}
    cap = backend.trial_timeout(recipe, {"gens": 32, "lr": 1e-5})
    warm = plan.expected(took, plan.work(values, backend.work_keys), cap, 1800)
    cold = plan.expected(took, plan.work(values, backend.work_keys), cap, 1800, cold=True)
    assert cap == 2400 and 170 < cold.cold_s < 190
    assert 500 < warm.seconds < 700 and 680 < cold.seconds < cap


def test_with_ten_minutes_left_a_resume_runs_the_next_candidates_runs_that_fit(ws):
    """08's cold gens-32 run is planned at 686 s; with 600 s left it keeps its place at the head of the queue and
    07's run (gens 11, 560 s) starts instead; a baseline's place is never taken."""
    recipe = load_recipe(RUN / "recipe.yaml")
    backend = get_backend("openrlhf")
    with closing(Ledger(ws.ledger_path)) as ledger:
        study = ledger.study()
        records = ledger.records(study.id)
        took = plan.history(records.finished(last=20), backend.work_keys, first_end=records.first_end())
        view = StudyView(ws, records, study, recipe)
        queue = RunQueue(records, view, backend, OptunaStrategy(view))
        queue.requeue()
        baseline = queue._proposal_of(records.trial(1))

    def planned(p) -> float:
        values = {**recipe.train, **p.values}
        cap = backend.trial_timeout(recipe, p.values)
        return plan.expected(took, plan.work(values, backend.work_keys), cap, 1800, cold=True).seconds

    held = queue.pending[0]
    assert held.confirms == 8 and planned(held) > 600
    smaller = queue.fitting_confirmation(held, lambda p: planned(p) <= 600)
    assert smaller is not None and smaller.confirms == 7 and planned(smaller) < 600
    assert queue.pending[0] is held and [p.confirms for p in queue.pending].count(7) == 2
    assert queue.fitting_confirmation(held, lambda p: False) is None
    assert queue.fitting_confirmation(baseline, lambda p: True) is None
