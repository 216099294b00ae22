"""Where the search does not go back (autorl/search/revisit.py, autorl/data/rules/revisit.yaml).

A real study of the default recipe (issue 46) pruned all 30 trials with lr >= 1e-3 and still proposed that range at
trial 102, and gave 71 of its 89 search trials to the hypothesis that had already paid twice. Here: the rule on
ledger rows, the proposer on a real ledger and real Optuna, and a real study on the command backend whose script
has a cliff at lr 1e-3 (tests/search/lr_cliff.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from autorl.errors import RulesError
from autorl.ledger import Event, Ledger, Trial
from autorl.recipe import SearchParam, validate_recipe
from autorl.search import revisit
from autorl.search.proposer import Proposer
from autorl.states import Confirmation, CrashCategory, Kind, TrialStatus, Verdict
from autorl.states import Proposer as By
from autorl.study.controller import RunOptions
from autorl.workspace import Workspace
from tests.conftest import git, run_cli

RULES = revisit.load_table()
NEED, AFTER = RULES.closed.trials, RULES.rest.after
BASE = {"model": "m", "lr": 5e-7, "gens": 8, "seed": 0}


def row(number: int, **values: Any) -> Trial:
    """A finished trial row: ``lr``/``gens`` go into its params, every other keyword is a column."""
    params = {**BASE, **{k: values.pop(k) for k in ("lr", "gens", "model") if k in values}}
    cols: dict[str, Any] = {"status": TrialStatus.COMPLETE, "proposer": By.HYPOTHESIS, "kind": Kind.TRIAL, **values}
    return Trial(number=number, attempt=f"attempt-{number:02d}", params=params, **cols)


def pruned(number: int, parent: int | None, **values: Any) -> Trial:
    return row(number, status=TrialStatus.PRUNED, verdict=Verdict.PRUNED, parent=parent, **values)


def incumbent_at(lr: float, number: int = 4) -> list[Trial]:
    """Three baseline runs, and a confirmed candidate at ``lr`` with its two confirmation runs."""
    base = [row(n, proposer=By.BASELINE) for n in (1, 2, 3)]
    inc = row(number, lr=lr, verdict=Verdict.IMPROVED, confirmation=Confirmation.CONFIRMED, objective=0.6)
    runs = [row(number + k, lr=lr, proposer=By.CONFIRM, confirms=number, seed=k) for k in (1, 2)]
    return [*base, inc, *runs]


def closures(trials: list[Trial]) -> revisit.Closures:
    inc = next((t for t in trials if t.confirmation == Confirmation.CONFIRMED), None)
    return revisit.Closures(trials, inc, NEED, BASE)


# ---------------------------------------------------------------- the rule, on rows


def test_the_shipped_rules_load_and_a_bad_file_is_one_line(tmp_path):
    assert NEED >= 2 and AFTER >= 2
    bad = tmp_path / "revisit.yaml"
    bad.write_text("closed: {trials: 0}\nrest: {after: 6}\n")
    with pytest.raises(RulesError, match=r"revisit rules .*revisit\.yaml: .*fix the file \(see docs/hypotheses\.md\)"):
        revisit.load_table(bad)


def test_trials_pruned_beyond_everything_that_held_up_close_that_side():
    rows = incumbent_at(5e-5) + [row(7, lr=2e-4, verdict=Verdict.FLAT, parent=4)]
    cliff = [pruned(8 + k, 4, lr=lr) for k, lr in enumerate((3e-3, 1e-3, 8e-3))]
    assert closures(rows + cliff[: NEED - 1]).regions({**BASE, "lr": 5e-3}) == []  # one short of the rule
    c = closures(rows + cliff)
    region = c.at({**BASE, "lr": 1.5e-3}, ["lr"])
    assert region is not None and (region.key, region.side, region.bound) == ("lr", ">=", 1e-3)
    assert "lr >= 0.001 is closed: 3 trials there (attempt-08, attempt-09, attempt-10)" in region.why()
    assert "held up against attempt-04" in region.why()
    assert c.at({**BASE, "lr": 5e-4}, ["lr"]) is None  # between what held up and the nearest pruned trial: open
    assert c.at({**BASE, "lr": 1.5e-3}, ["gens"]) is None  # only the keys asked about
    assert c.at({**BASE, "lr": 1.5e-3, "model": "other"}, ["lr"]) is None  # other words: another region


def test_a_trial_that_changed_two_keys_is_blamed_on_neither():
    rows = incumbent_at(5e-5) + [pruned(7 + k, 4, lr=lr, gens=16) for k, lr in enumerate((1e-3, 3e-3, 8e-3))]
    assert closures(rows).regions(BASE) == []


def test_a_trial_that_held_up_after_the_incumbent_reopens_the_side():
    rows = incumbent_at(5e-5) + [pruned(7 + k, 4, lr=lr) for k, lr in enumerate((1e-3, 3e-3, 8e-3))]
    later = row(10, lr=2e-3, verdict=Verdict.FLAT, parent=4)
    assert closures(rows).at({**BASE, "lr": 2e-3}, ["lr"]) is not None
    assert closures([*rows, later]).at({**BASE, "lr": 2e-3}, ["lr"]) is None  # only 3e-3 and 8e-3 lie beyond it


def test_runs_that_ended_well_before_the_incumbent_do_not_hold_a_side_open():
    """gens 2 ran to its end as the baseline, then was clearly worse than the incumbent at gens 4 three times."""
    base = [row(n, proposer=By.BASELINE, gens=2) for n in (1, 2, 3)]
    inc = row(4, gens=4, verdict=Verdict.IMPROVED, confirmation=Confirmation.CONFIRMED, objective=0.6)
    rows = [*base, inc] + [pruned(5 + k, 4, gens=2, seed=k) for k in range(3)]
    region = revisit.Closures(rows, inc, NEED, {**BASE, "gens": 2}).at({**BASE, "gens": 2}, ["gens"])
    assert region is not None and region.describe() == "gens <= 2"


@pytest.mark.parametrize(
    "category, closes", [(CrashCategory.ILLEGAL_MEMORY_ACCESS, True), (CrashCategory.SHARED_GPU, False)]
)
def test_a_crash_closes_only_when_triage_blames_its_values(category, closes):
    crash = {"status": TrialStatus.CRASH, "verdict": Verdict.CRASH, "crash_category": category, "parent": 4}
    rows = incumbent_at(5e-5) + [row(7 + k, lr=lr, **crash) for k, lr in enumerate((1e-3, 3e-3, 8e-3))]
    assert (closures(rows).at({**BASE, "lr": 5e-3}, ["lr"]) is not None) == closes


def test_a_space_wholly_inside_a_closed_region_is_covered():
    c = closures(incumbent_at(5e-5) + [pruned(7 + k, 4, lr=lr) for k, lr in enumerate((1e-3, 3e-3, 8e-3))])
    assert c.covers({"lr": SearchParam(low=1.5e-3, high=1e-2, log=True)}, BASE) is not None
    assert c.covers({"lr": SearchParam(low=7.5e-5, high=1e-2, log=True)}, BASE) is None
    assert c.covers({"lr": SearchParam(choices=[2e-3, 4e-3])}, BASE) is not None


def test_a_hypothesis_whose_last_trials_gained_nothing_rests_until_a_new_incumbent():
    rows = incumbent_at(5e-6)
    flats = [row(7 + k, lr=1e-5 * (k + 1), verdict=Verdict.FLAT, parent=4, hypothesis="h13") for k in range(AFTER)]
    inc = rows[3]
    assert revisit.rested(rows + flats[:-1], ["h13"], inc, AFTER) == {}
    rest = revisit.rested(rows + flats, ["h13"], inc, AFTER)["h13"]
    assert rest.trials == tuple(t.attempt for t in flats) and "over the confirmed incumbent attempt-04" in rest.why()
    waiting = row(20, lr=2e-5, verdict=Verdict.IMPROVED, confirmation=Confirmation.CANDIDATE, hypothesis="h13")
    assert revisit.rested([*rows, *flats, waiting], ["h13"], inc, AFTER) == {}  # a gain still being confirmed
    confirms = [row(20 + k, proposer=By.CONFIRM, confirms=7, hypothesis="h13", verdict=Verdict.FLAT) for k in (1, 2)]
    assert revisit.rested(rows + flats[:-1] + confirms, ["h13"], inc, AFTER) == {}  # re-runs are not proposals
    new = row(30, lr=5e-5, verdict=Verdict.IMPROVED, confirmation=Confirmation.CONFIRMED, hypothesis="h01")
    assert revisit.rested([*rows, *flats, new], ["h13"], new, AFTER) == {}  # the new incumbent re-opens it


# ---------------------------------------------------------------- the proposer, on a real ledger and real Optuna

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
SEARCH = {"lr": {"low": 1e-7, "high": 1e-2, "log": True}}


@pytest.fixture
def make(tmp_path):
    """(proposer, ledger, study id) over a fresh workspace, with three baseline runs of recorded flat metrics."""
    root = tmp_path / "ws"
    assert run_cli("init", str(root)).returncode == 0
    ws = Workspace.open(root)
    ledger = Ledger(ws.ledger_path)

    def build(strategy: str) -> tuple[Proposer, Ledger, int]:
        base = validate_recipe(
            {"backend": "embedded", "train": TRAIN, "search": SEARCH, "verdict": {"baseline_repeats": 3}}
        )
        sid = ledger.create_study(
            name="s", recipe_path="r.yaml", recipe="", base_sha="x", strategy=strategy, budget_s=1.0, optuna_study="s"
        )
        for n in (1, 2, 3):
            add(ledger, sid, n, proposer=By.BASELINE, objective=0.476)
        return (
            Proposer(ws, ledger, ledger.study(study_id=sid), base, RunOptions(strategy=strategy, seed=0)),
            ledger,
            sid,
        )

    return build


def add(ledger: Ledger, sid: int, number: int, **cols: Any) -> None:
    """A finished trial row whose params are the validated base recipe's train block with ``values``, as a study
    writes them, and the recorded metrics of a flat run."""
    params = {**validate_recipe({"backend": "embedded", "train": TRAIN}).train, **cols.pop("values", {})}
    cols.setdefault("status", TrialStatus.COMPLETE)
    tid = ledger.add_trial(study_id=sid, number=number, attempt=f"attempt-{number:02d}", params=params, **cols)
    lines = (RUNS / "flat-lr5e-7.jsonl").read_text().splitlines()
    ledger.add_metrics(tid, [json.loads(line) for line in lines])


def test_the_search_asks_again_rather_than_propose_inside_a_closed_region(make):
    proposer, ledger, sid = make("random")
    for k, lr in enumerate((1e-3, 2e-3, 6e-3)):
        add(
            ledger, sid, 4 + k, proposer=By.RANDOM, values={"lr": lr}, status=TrialStatus.PRUNED, verdict=Verdict.PRUNED
        )
    proposals = [proposer.next() for _ in range(30)]  # a random sampler puts a fifth of them at lr >= 1e-3
    inside = [p for p in proposals if p.values.get("lr", 0) >= 1e-3]
    assert all("run all the same" in p.why for p in inside), inside
    skipped = [e.message for e in ledger.events(sid, limit=1000) if e.kind == "closed"]
    assert skipped and all("lr >= 0.001 is closed: 3 trials there" in m for m in skipped), skipped
    assert all(m.startswith("skipped lr=") and m.endswith("told Optuna pruned") for m in skipped)


def test_the_hypothesis_that_paid_rests_after_its_gains_stop_and_a_new_incumbent_reopens_it(make):
    proposer, ledger, sid = make("hypotheses")
    confirmed = {"verdict": Verdict.IMPROVED, "confirmation": Confirmation.CONFIRMED}
    add(
        ledger,
        sid,
        4,
        proposer=By.MOVE,
        hypothesis="h13-flat-learning",
        values={"lr": 5e-6},
        objective=0.55,
        **confirmed,
    )
    for n in (5, 6):
        add(ledger, sid, n, proposer=By.CONFIRM, hypothesis="h13-flat-learning", values={"lr": 5e-6}, confirms=4)
    p = proposer.next()
    assert (p.proposer, p.hypothesis) == (By.MOVE, "h13-flat-learning")  # its move is still the next step
    for k in range(AFTER):
        lr = 5e-6 * (1.5 + k)
        add(ledger, sid, 7 + k, proposer=By.HYPOTHESIS, hypothesis="h13-flat-learning", values={"lr": lr}, parent=4,
            verdict=Verdict.FLAT, objective=0.55)  # fmt: skip
    p = proposer.next()
    assert p.hypothesis != "h13-flat-learning", p
    events = ledger.events(sid, limit=1000)
    rests = [e.message for e in events if e.kind == "rested"]
    assert len(rests) == 1 and rests[0].startswith(f"h13-flat-learning rested: its last {AFTER} trials (attempt-07, ")
    assert "gained nothing over the confirmed incumbent attempt-04" in rests[0]
    assert "re-opens when a new incumbent is confirmed" in rests[0]
    add(ledger, sid, 20, proposer=By.HYPOTHESIS, hypothesis="h01-advantage-scaling", parent=4, objective=0.6,
        values={"lr": 5e-6, "loss_type": "dr_grpo", "scale_rewards": False}, **confirmed)  # fmt: skip
    p = proposer.next()
    assert p.hypothesis == "h13-flat-learning", p
    reopened = [e.message for e in ledger.events(sid, limit=1000) if e.kind == "re-opened"]
    assert reopened == ["h13-flat-learning re-opened: attempt-20 was confirmed since it was rested"]


# ---------------------------------------------------------------- a real study

SCRIPT = Path(__file__).resolve().with_name("lr_cliff.py")
CLIFF = 1e-3
HYPOTHESES = {
    "x01-lr": ("The learning rate is too low", "high", "lr: {scale: [1.5, 100000.0], log: true}"),
    "x02-gens": ("Groups are too small to compare completions", "medium", "gens: {choices: [2, 4, 8]}"),
}
SEARCHES = (By.HYPOTHESIS, By.MOVE, By.OPTUNA, By.RANDOM)  # proposals of the search, not re-runs


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> tuple[list[Trial], list[Event]]:
    ws = tmp_path_factory.mktemp("cliff") / "ws"
    assert run_cli("init", str(ws)).returncode == 0
    for hid, (title, priority, search) in HYPOTHESES.items():
        (ws / "hypotheses" / f"{hid}.md").write_text(
            f"---\nid: {hid}\ntitle: {title}\npriority: {priority}\nsearch:\n  {search}\n"
            "success: {confirm: the objective rises, refute: no gain}\nbackends: [command]\n---\nA test idea.\n"
        )
    argv = [sys.executable, str(SCRIPT), "--lr", "{lr}", "--gens", "{gens}", "--seed", "{seed}"]
    recipe = {
        "name": "cliff",
        "backend": "command",
        "train": {"argv": [*argv, "--out", "{run_dir}/metrics.jsonl"], "lr": 1e-6, "gens": 2, "seed": 0},
        "search": {"lr": {"low": 1e-7, "high": 0.1, "log": True}, "gens": {"choices": [2, 4, 8]}},
        "verdict": {"baseline_repeats": 3, "confirm_runs": 2},
        "timeout_s": 60,
    }
    (ws / "recipes" / "cliff.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "the cliff recipe and two ideas")
    args = ("run", "recipes/cliff.yaml", "--seed", "0", "--max-trials", "40", "--budget", "10m", "--quiet")
    r = run_cli("-C", str(ws), *args, timeout=540)
    assert r.returncode == 0, r.stderr + r.stdout
    ledger = Ledger(ws / "ledger.sqlite")
    return ledger.trials(), list(reversed(ledger.events(limit=10_000)))


@pytest.mark.slow
def test_a_real_study_does_not_propose_a_pruned_region_again_without_saying_why(study):
    rows, events = study
    blamed: list[float] = []  # x01 trials change lr alone: those past the cliff were clearly worse
    for t in rows:
        lr = t.params["lr"]
        if t.proposer in SEARCHES and lr >= CLIFF:
            inside = [b for b in blamed if b <= lr]
            assert len(inside) < NEED or "run all the same" in (t.why or ""), (t.attempt, lr, inside)
        if t.hypothesis == "x01-lr" and t.proposer == By.HYPOTHESIS and lr >= CLIFF:
            assert t.verdict in (Verdict.PRUNED, Verdict.REGRESSED), t
            blamed.append(lr)
    assert len(blamed) >= NEED, [(t.attempt, t.params["lr"], t.verdict) for t in rows]  # the region did close
    skipped = [e.message or "" for e in events if e.kind == "closed" and (e.message or "").startswith("skipped lr=")]
    assert skipped and all(" is closed: " in m and m.endswith("told Optuna pruned") for m in skipped), skipped


@pytest.mark.slow
def test_a_real_study_rests_the_idea_that_stopped_paying_and_reopens_it_at_a_new_incumbent(study):
    rows, events = study
    by_number = {t.number: t for t in rows}
    settled = {  # candidate -> the run whose end confirmed it
        t.number: max(r.number for r in rows if r.confirms == t.number)
        for t in rows
        if t.confirmation == Confirmation.CONFIRMED
    }
    for t in rows:
        if t.proposer not in (By.HYPOTHESIS, By.MOVE):
            continue
        known = [by_number[c] for c, at in settled.items() if at < t.number]
        inc = max(known, key=lambda c: c.objective or 0, default=None)
        since = [
            r
            for r in rows
            if r.hypothesis == t.hypothesis
            and r.proposer in (By.HYPOTHESIS, By.MOVE)
            and (inc.number if inc else 0) < r.number < t.number
        ]
        if not any(r.verdict == Verdict.IMPROVED for r in since):
            assert len(since) < AFTER, (t.attempt, inc and inc.attempt, [r.attempt for r in since])
    rests = [e.message or "" for e in events if e.kind == "rested" and " rested: its last " in (e.message or "")]
    reopened = [e.message or "" for e in events if e.kind == "re-opened"]
    assert rests and reopened, [(e.kind, e.message) for e in events if e.kind in ("rested", "re-opened")]
    hid, by = reopened[0].split(" re-opened: ")[0], reopened[0].split(" re-opened: ")[1].split(" ")[0]
    assert any(m.startswith(f"{hid} rested: its last {AFTER} trials") for m in rests)
    number = next(t.number for t in rows if t.attempt == by)
    assert any(t.hypothesis == hid and t.number > number for t in rows), "re-opened, it is tested again"
