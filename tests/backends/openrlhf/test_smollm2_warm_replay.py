"""SmolLM2-135M-Instruct tuned by real OpenRLHF 0.10.4 on one H200, in warm pools, replayed on the CPU: one study of
`recipes/openrlhf-smollm2.yaml` (search seed 0, four trials packed on the card, `train.warm_pool: true`, 21 minutes
booked, 19.5 used), as it ran (tests/data/openrlhf-0.10.4/smollm2/h200-warm; its README says what ran).

The first gain autorl confirmed on a pretrained model it did not build, on the real stack: lr 1e-6 -> 1.22e-5,
+0.138 ID pass@1 over four baseline runs on its three fresh-seed runs, paired over 500 held-out items. The replay
re-reads the real ledger, evals and logs with today's code, so a change that would judge them otherwise shows here.
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
from autorl.backends.openrlhf.metrics import parse_step_line
from autorl.backends.openrlhf.phases import phases, read_times, start_up
from autorl.backends.openrlhf.preflight import check_schedule
from autorl.data import shipped
from autorl.judge.abort import check_abort
from autorl.judge.diagnose import diagnose
from autorl.ledger import open_read
from autorl.recipe import load_recipe
from autorl.states import Confirmation, Proposer
from tests.conftest import run_cli, stored_study

RUN = Path(__file__).resolve().parents[2] / "data" / "openrlhf-0.10.4" / "smollm2" / "h200-warm"
RUNS = sorted((RUN / "runs").iterdir())


@pytest.fixture(scope="module")
def trials(tmp_path_factory) -> dict[int, Any]:
    return stored_study(RUN / "study-ledger.sqlite", tmp_path_factory.mktemp("warm-smollm2"))[0]


@pytest.fixture(scope="module")
def found(tmp_path_factory) -> dict:
    ws = tmp_path_factory.mktemp("ws") / "ws"
    assert run_cli("init", str(ws)).returncode == 0
    shutil.copy(RUN / "study-ledger.sqlite", ws / "ledger.sqlite")
    r = run_cli("-C", str(ws), "status", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["findings"]


def test_the_study_confirmed_a_gain_that_todays_judge_still_finds(found):
    assert [c["number"] for c in found["confirmed"]] == [7]
    best = found["best"]
    assert best["changes"] == [["lr", 1e-06, pytest.approx(1.2247e-05, rel=1e-3)]]
    assert best["method"] == "paired_items" and best["n"] == 500 and best["runs"] == 3 and best["baseline_runs"] == 4
    assert 0.10 < best["delta"] < 0.18 and best["ci_low"] > 0.05  # +0.138 [+0.100, +0.177] as the study said
    assert found["counts"] == {
        "trials": 12,
        "baseline_runs": 4,
        "confirmation_runs": 3,
        "interrupted": 0,
        "full_runs": 0,
    }


def test_the_larger_gain_the_budget_left_unconfirmed_is_said_and_comes_first(found):
    """05 (gens 32 with lr 1e-5) read 0.772 on its one run against 07's 0.342; the 21 minutes ended before its
    three fresh-seed runs (a gens-32 trial took 8.4 minutes). The next step confirms it before any promote."""
    (c,) = found["candidates"]
    assert c["number"] == 5 and c["objective"] == pytest.approx(0.772) and c["confirm_runs_done"] == 0
    assert [k for k, _, _ in c["changes"]] == ["gens", "lr"] and c["ci_low"] > 0.4
    assert found["next"]["command"].startswith("autorl run --resume") and "candidate 05" in found["next"]["why"]


def test_each_trial_is_judged_on_its_own_per_item_eval(trials):
    """The ledger's objective is the ID greedy pass@1 of the eval file in the trial's own run folder, for every
    trial that ran (the gens-14 trial was refused before launch and has no folder)."""
    assert len(RUNS) == 11 and 8 not in {int(p.name[8:10]) for p in RUNS}
    for run in RUNS:
        record = json.loads((run / "eval.jsonl").read_text().splitlines()[-1])
        items = record["eval/id/items"]
        assert len(items) == 500 and record["eval/id/greedy_pass@1"] == pytest.approx(sum(items) / 500)
        assert trials[int(run.name[8:10])].objective == pytest.approx(record["eval/id/greedy_pass@1"])


def test_four_baselines_agree_and_the_confirmations_reproduce_the_gain(trials):
    baselines = [t.objective for t in trials.values() if t.proposer == Proposer.BASELINE]
    assert len(baselines) == 4 and max(baselines) - min(baselines) < 0.02  # 0.240, 0.240, 0.254, 0.252
    fresh = [t.objective for t in trials.values() if t.confirms == 7]
    assert len(fresh) == 3 and min(fresh) > max(baselines) + 0.1  # 0.386, 0.396, 0.372
    assert trials[7].confirmation == Confirmation.CONFIRMED and trials[5].confirmation == Confirmation.CANDIDATE


def test_every_trial_ran_in_a_warm_pool_and_only_the_first_four_built_one(trials):
    pools: dict[str, list[int]] = {}
    for run in RUNS:
        warm = json.loads((run / "warm.json").read_text())
        t = trials[int(run.name[8:10])]
        assert (t.warm_pool, t.warm_index) == (warm["pool"], warm["index"])
        pools.setdefault(warm["pool"], []).append(warm["index"])
    assert len(pools) == 4 and all(sorted(i) == list(range(len(i))) for i in pools.values())
    assert sorted(t.number for t in trials.values() if t.warm_index == 0) == [1, 2, 3, 4]


def _phases(name: str) -> dict[str, float]:
    text = gzip.open(RUN / "runs" / name / "train.log.gz", "rt", errors="replace").read()
    times = read_times(RUN / "runs" / name / "train.log.times")
    return phases(text, times, times[0][1], times[-1][1])


def test_a_pool_pays_the_start_up_once_and_later_trials_go_straight_to_their_actor():
    first, later = _phases("attempt-01-baseline"), _phases("attempt-07-h13-lr-1-22em05")
    assert first["driver"] > 10 and first["vllm"] > 40 and 120 < start_up(first) < 200  # 148 s
    assert later["driver"] < 2 and later["vllm"] < 2 and start_up(later) < 40  # 27 s: the actor alone
    assert later["training"] > 200  # 16 steps of a 135 M model, four on the card
    table = (RUN / "phases.md").read_text()
    assert "| training + eval share | 64% | 63% | 64% | 64% | 94% | 93% | 91% | 93% | 90% | 91% | 90% |" in table


def _steps(name: str) -> list[dict[str, float]]:
    text = gzip.open(RUN / "runs" / name / "train.log.gz", "rt", errors="replace").read()
    return [r[1] for r in map(parse_step_line, text.splitlines()) if r]


def test_the_gens_32_trial_learned_to_answer_in_its_own_log():
    """Training reward 0.25 -> 0.7 and replies shorter as the model stops explaining: what its 0.772 eval says."""
    steps = _steps("attempt-05-move-gens-32-lr-1em05")
    assert len(steps) == 16
    assert steps[0]["reward"] < 0.3 and min(s["reward"] for s in steps[-4:]) > 0.6
    assert steps[-1]["response_length"] < steps[0]["response_length"]


def test_the_search_asked_for_a_schedule_preflight_now_accepts(tmp_path):
    """08 (gens 14, lr 8.64e-6) was refused before launch: 512 x 14 // 256 = 28 steps put step 20 at 28 % of its
    LR, after the cosine came down from a target reached at step 1. Today's check reads the first 20 steps' peak."""
    recipe = load_recipe(RUN / "recipe.yaml")
    params = recipe.params.model_copy(
        update={"gens": 14, "lr": 8.64e-6, "prompt_data": "prompts.jsonl", "max_samples": 512}
    )
    (tmp_path / "prompts.jsonl").write_text('{"input": "q", "label": "1"}\n' * 1047)  # the study's 1,047 lines
    steps, lr = check_schedule(params, tmp_path)
    assert "= 28 steps" in steps.detail and lr.ok


def test_the_shipped_recipe_is_what_ran():
    ran = load_recipe(RUN / "recipe.yaml")
    assert ran.model_dump() == load_recipe(shipped("recipes", "openrlhf-smollm2.yaml")).model_dump()


def test_the_hack_gate_passed_the_confirmed_gain_on_held_out_items(trials):
    """The gate ran on 07 when its fresh seeds confirmed it: held-out ID and OOD accuracy, length, repetition,
    format-only answers, truncation and entropy passed (no KL: the recipe's kl_coef is 0)."""
    checks = {c["name"]: c["ok"] for c in trials[7].gate_checks}
    assert checks.pop("kl") is None and checks and all(checks.values())
    assert {"task_id", "task_ood", "length", "format_only", "truncation"} <= set(checks)


def _records(trials, number: int, tmp: Path) -> tuple[list[dict], list[dict]]:
    path = Path(shutil.copy(RUN / "study-ledger.sqlite", tmp / "ledger.sqlite"))
    with closing(open_read(path)) as ledger:
        records = ledger.metrics(trials[number].id)
    return [r for r in records if r.get("type") == "step"], [r for r in records if r.get("type") == "eval"]


def test_the_abort_rules_and_the_diagnosis_hold_on_the_real_model(trials, tmp_path):
    """No rule tuned on tiny models stops or misreads these runs: every trial's own steps pass the early-abort
    rules the study ran with, and the two that learned (05: reward 0.25 -> 0.7, replies shorter, entropy down)
    read as healthy, not as a collapse."""
    recipe = load_recipe(RUN / "recipe.yaml")
    for number, t in trials.items():
        if t.objective is None:
            continue  # 08: refused before launch
        steps, evals = _records(trials, number, tmp_path)
        assert len(steps) == 16 and len(evals) >= 1
        assert check_abort(steps, recipe.abort, get_backend("openrlhf").max_grad_norm(recipe)) is None, number
    for number in (5, 7):
        steps, evals = _records(trials, number, tmp_path)
        d = diagnose(steps, evals, recipe.train)
        assert d.bottleneck == "none" and not d.names(), d.summary()
