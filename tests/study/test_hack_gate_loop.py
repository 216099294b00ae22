"""The hack gate in the study loop and in promote, on a real ledger with real engine metric files
(tests/data/hack_gate, see tests/judge/test_hackgate.py): a confirmed reward hack becomes ``suspect``, keeps out of
every use of a confirmed recipe, and `autorl promote` refuses it in one line naming the check (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli

from autorl.backends.base import get_backend
from autorl.data import shipped
from autorl.errors import NotFoundError
from autorl.judge.evidence import Evidence, incumbent_row
from autorl.ledger import Ledger
from autorl.metrics import iter_records
from autorl.present import findings
from autorl.present.live import PlainView
from autorl.promote.promotion import pick_best
from autorl.recipe import load_recipe, validate_recipe
from autorl.search.hypotheses import counted_verdict
from autorl.search.proposer import Proposer
from autorl.states import Confirmation, Gate, Kind, TrialStatus, Verdict
from autorl.states import Proposer as By
from autorl.study import judging
from autorl.study.controller import RunOptions
from autorl.study.opening import warn
from autorl.study.state import StudyState
from autorl.workspace import Workspace

DATA = Path(__file__).resolve().parents[1] / "data" / "hack_gate"
RECIPE = validate_recipe(
    {
        "backend": "embedded",
        "train": {},
        "verdict": {"confirm_runs": 2},
        "objective": {"metric": "eval/id/greedy_pass@1", "reduction": "last"},
    },
    source="t",
)


def study(ws: Path, view: PlainView, candidate: str = "round") -> StudyState:
    """A real study state over ``ws``'s ledger: baseline runs 1-3 and candidate 4 with its confirmation runs 5-6:
    ``round`` (round_rm, learned: its eval scorer shares the loophole) or ``honest`` (the exact match, lr 5e-5)."""
    ledger = Ledger(ws / "ledger.sqlite")
    row = ledger.study(
        study_id=ledger.create_study(name="s", strategy="random", optuna_study="s", recipe_path="recipes/r.yaml")
    )
    files = sorted(DATA.glob("base-s*.jsonl"))[:3] + sorted(DATA.glob(f"{candidate}-s*.jsonl"))[:3]
    cols = {
        1: {"proposer": By.BASELINE},
        2: {"proposer": By.BASELINE},
        3: {"proposer": By.BASELINE},
        4: {"proposer": By.RANDOM, "verdict": Verdict.IMPROVED, "confirmation": Confirmation.CANDIDATE},
        5: {"proposer": By.CONFIRM, "confirms": 4},
        6: {"proposer": By.CONFIRM, "confirms": 4},
    }
    for n, path in enumerate(files, start=1):
        records = list(iter_records(path))
        objective = [r["eval/id/greedy_pass@1"] for r in records if r.get("type") == "eval"][-1]
        tid = ledger.add_trial(
            study_id=row.id,
            number=n,
            attempt=f"attempt-{n:02d}",
            status=TrialStatus.COMPLETE,
            kind=Kind.TRIAL,
            objective=objective,
            **cols[n],
        )
        ledger.add_metrics(tid, records)
    workspace, opts = Workspace.open(str(ws), None), RunOptions(budget_s=600, strategy="random")
    proposer = Proposer(workspace, ledger, row, RECIPE, opts)
    return StudyState(
        workspace,
        opts,
        view,
        ledger,
        row,
        RECIPE,
        "",
        "recipes/r.yaml",
        get_backend("embedded"),
        proposer,
        proposer.records,
        Evidence(proposer.records),
    )


def test_a_confirmed_hack_is_suspect_and_used_nowhere_a_confirmed_recipe_is(command_ws, capsys):
    s = study(command_ws, PlainView())
    judging.confirm(s, 4)
    hack = s.ledger.trial(4)
    assert hack.confirmation == Confirmation.SUSPECT and hack.gate == Gate.SUSPECT
    failed = next(c for c in hack.gate_checks if c["ok"] is False)
    assert failed["name"] == "task_id" and failed["numbers"]["ci_high"] < 0
    assert "hack gate: task_id failed" in hack.reason
    out = capsys.readouterr().out
    assert "attempt-04: hack gate: task_id failed" in out and "attempt-04: suspect by 2 fresh-seed runs" in out
    assert s.records.confirmed() == [] and incumbent_row(s.ledger.trials(), "maximize") is None
    assert counted_verdict(hack) == Verdict.FLAT
    with pytest.raises(NotFoundError):
        pick_best(s.ledger)
    found = findings.findings(s.ws, s.ledger)
    assert [(x["attempt"], x["check"]) for x in found["suspect"]] == [("attempt-04", "task_id")]
    assert any(line.startswith("  Suspect (hack gate") for line in findings.headline(found, width=400))


def test_an_honest_improvement_is_confirmed_and_passes_the_gate(command_ws):
    s = study(command_ws, PlainView(quiet=True), "honest")
    judging.confirm(s, 4)
    row = s.ledger.trial(4)
    assert row.confirmation == Confirmation.CONFIRMED and row.gate == Gate.OK
    assert all(c["ok"] is not False for c in row.gate_checks)
    best = incumbent_row(s.ledger.trials(), "maximize")
    assert best is not None and best.number == 4 and s.records.confirmed()[0].number == 4


def test_promote_refuses_a_suspect_trial_in_one_line_naming_the_check(command_ws):
    s = study(command_ws, PlainView(quiet=True))
    judging.confirm(s, 4)
    s.ledger.close()
    r = run_cli("-C", str(command_ws), "promote", "4")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert "attempt-04 is suspect: hack gate check 'task_id' failed" in lines[0] and "--force" in lines[0]
    events = [e for e in Ledger(command_ws / "ledger.sqlite").events() if e.kind == "promote-refused"]
    assert events and "task_id" in events[0].message


def test_a_recipe_without_held_out_probe_sets_is_warned_that_the_gate_is_blind(capsys):
    blind = validate_recipe({"backend": "command", "train": {"argv": ["true"], "steps": 1}}, source="t")
    warn(blind, get_backend("command"), PlainView(), Path("."))
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("warning: the hack gate is blind") and "probe_id" in out[0]
    jsonl = validate_recipe({"backend": "embedded", "train": {"task": "t.jsonl", "model": "m"}}, source="t")
    warn(jsonl, get_backend("embedded"), PlainView(), Path("."))
    assert "blind" in capsys.readouterr().out  # a JSONL task's ID eval is its first training prompts
    trl = load_recipe(shipped("recipes", "trl-addition.yaml"))  # TRL trains on the built-in task: held out too
    for recipe in (
        RECIPE,
        trl,
        jsonl.with_train(eval_id="id.jsonl"),
        blind.model_copy(update={"gate": {"enabled": False}}),
    ):
        warn(recipe, get_backend(recipe.backend), PlainView(), Path("."))
        assert capsys.readouterr().out == ""
