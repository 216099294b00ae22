"""`autorl hypotheses`: per idea, the trials that tested it (move rules counted apart), its confirmed
improvements among its candidates, and the confirmed gain over the parent; `autorl ledger --json` says per
trial who proposed it and why. A real workspace and ledger, the real command in a child process."""

from __future__ import annotations

import json
import os

import pytest

from autorl.ledger import Ledger, Trial
from autorl.present.review import confirmed_gain
from autorl.states import Confirmation, Proposer, TrialStatus, Verdict
from tests.conftest import run_cli

BASE, MOVE, CONFIRM, HYP = Proposer.BASELINE, Proposer.MOVE, Proposer.CONFIRM, Proposer.HYPOTHESIS
H13, H05 = "h13-flat-learning", "h05-reward-signal"
# number, proposer, hypothesis, verdict, confirmation, confirms, parent, objective, why
ROWS = [
    (1, BASE, None, None, None, None, None, 0.40, "baseline: the recipe as written"),
    (2, BASE, None, None, None, None, None, 0.42, "baseline repeat 2"),
    (3, MOVE, H13, Verdict.FLAT, None, None, None, 0.43, "move flat_learning: lr 1e-07 -> 1e-06"),
    (4, MOVE, H13, Verdict.IMPROVED, Confirmation.CONFIRMED, None, None, 0.55, "move flat_learning: lr 1e-06 -> 1e-5"),
    (5, CONFIRM, H13, None, None, 4, None, 0.50, "confirmation 1/2 of candidate 04"),
    (6, CONFIRM, H13, None, None, 4, None, 0.52, "confirmation 2/2 of candidate 04"),
    (7, HYP, H05, Verdict.IMPROVED, Confirmation.REJECTED, None, 4, 0.60, "tests h05-reward-signal"),
    (8, CONFIRM, H05, None, None, 7, 4, 0.51, "confirmation 1/2 of candidate 07"),
    (9, HYP, H05, Verdict.REGRESSED, None, None, 4, 0.30, "tests h05-reward-signal"),
    (10, HYP, H13, None, None, None, 4, None, "still running"),
]


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    assert run_cli("init", str(root)).returncode == 0
    led = Ledger(root / "ledger.sqlite")
    sid = led.create_study(
        name="s", recipe_path="r.yaml", recipe="", base_sha="x", strategy="hypotheses", budget_s=1.0, optuna_study="s"
    )
    for n, proposer, hyp, verdict, state, confirms, parent, objective, why in ROWS:
        led.add_trial(
            study_id=sid,
            number=n,
            attempt=f"attempt-{n:02d}",
            proposer=proposer,
            hypothesis=hyp,
            why=why,
            status=TrialStatus.RUNNING if objective is None else TrialStatus.COMPLETE,
            verdict=verdict,
            confirmation=state,
            confirms=confirms,
            parent=parent,
            objective=objective,
        )
    led.close()
    return root


def test_counts_per_hypothesis_from_the_ledger(ws):
    counts = Ledger(ws / "ledger.sqlite").hypothesis_counts()
    assert counts["h13-flat-learning"] == {"tried": 2, "moves": 2, "candidates": 1, "confirmed": 1, "rejected": 0}
    assert counts["h05-reward-signal"] == {"tried": 2, "moves": 0, "candidates": 1, "confirmed": 0, "rejected": 1}


def test_confirmed_gain_is_fresh_runs_minus_the_parent():
    columns = ("number", "proposer", "hypothesis", "verdict", "confirmation", "confirms", "parent", "objective")
    trials = [Trial(**dict(zip(columns, r[:8])), status=TrialStatus.COMPLETE, study_id=1) for r in ROWS[:9]]
    assert confirmed_gain(trials[3], trials) == pytest.approx(0.51 - 0.41)  # baselines 0.40, 0.42; fresh 0.50, 0.52
    assert confirmed_gain(trials[6], trials) == pytest.approx(0.51 - (0.55 + 0.50 + 0.52) / 3)  # parent 04 + its runs


def test_cli_hypotheses_shows_tried_confirmed_gain_and_confidence(ws):
    proc = run_cli("-C", str(ws), "hypotheses", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["id"]: r for r in json.loads(proc.stdout)}
    h13, h05 = rows["h13-flat-learning"], rows["h05-reward-signal"]
    assert h13["trials"]["tried"] == 2 and h13["trials"]["confirmed"] == 1
    assert h13["confirmed_gain"] == pytest.approx(0.10)
    assert (h13["status"], h13["confidence"]) == ("validated", "medium")
    assert h05["confirmed_gain"] is None and h05["trials"]["rejected"] == 1
    assert rows["h02-token-masking"]["trials"]["tried"] == 0
    text = run_cli("-C", str(ws), "hypotheses", env={**os.environ, "COLUMNS": "80"}).stdout
    assert "h13-flat-learning" in text and "tried 2 (2 moves)" in text and "+0.1000" in text


def test_cli_ledger_json_says_who_proposed_each_trial_and_why(ws):
    rows = json.loads(run_cli("-C", str(ws), "ledger", "--json").stdout)
    move = next(r for r in rows if r["number"] == 3)
    assert (move["proposer"], move["hypothesis"]) == (Proposer.MOVE, "h13-flat-learning")
    assert move["why"].startswith("move flat_learning: lr")
