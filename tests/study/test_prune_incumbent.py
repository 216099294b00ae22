"""The noise-aware pruner measures a running trial against the confirmed incumbent as well as its parent.

A real random-search study on the command backend (real git, SQLite, Optuna, child processes): quality.py solves
each of 100 eval items with probability ``quality``. The baseline is at 0.3; 0.55 and 0.95 both beat it and are
confirmed in turn. Once 0.95 is the confirmed incumbent, a trial at 0.25 that is behind its parent (the baseline)
at the middle eval, though not clearly worse than it, is clearly worse than the incumbent and cannot become the next
incumbent: it is stopped there. A trial ahead of its parent at that eval (every 0.55, a lucky 0.25) runs on: it may
still end "improved", and a pruner that stops what would have been an improvement loses a find.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from conftest import git, run_cli

from autorl.judge.calibrate import percent
from autorl.ledger import Ledger, Trial
from autorl.states import Confirmation, TrialStatus, Verdict
from autorl.states import Proposer as By

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "data" / "scripts" / "quality.py"


def _study(ws: Path, trials: int) -> list[Trial]:
    argv = [
        sys.executable,
        str(SCRIPT),
        "--quality",
        "{quality}",
        "--seed",
        "{seed}",
        "--steps",
        "{steps}",
        "--out",
        "{run_dir}/metrics.jsonl",
    ]
    recipe = {
        "name": "quality",
        "backend": "command",
        "train": {"argv": argv, "quality": 0.3, "seed": 0, "steps": 4},
        "search": {"quality": {"choices": [0.25, 0.3, 0.55, 0.95]}},
        "verdict": {"baseline_repeats": 2, "confirm_runs": 2},
        "timeout_s": 60,
    }
    (ws / "recipes" / "quality.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    r = run_cli(
        "-C",
        str(ws),
        "run",
        "recipes/quality.yaml",
        "--strategy",
        "random",
        "--seed",
        "0",
        "--max-trials",
        str(trials),
        "--budget",
        "10m",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr + r.stdout
    return Ledger(ws / "ledger.sqlite").trials()


def _confirmed_at(rows: list[Trial], quality: float) -> int | None:
    """The attempt number of the last confirmation run of the confirmed trial at ``quality``."""
    done = [t for t in rows if t.confirmation == Confirmation.CONFIRMED and t.params["quality"] == quality]
    if not done:
        return None
    return max(t.number for t in rows if t.confirms == done[0].number)


def test_a_trial_clearly_behind_the_confirmed_incumbent_is_stopped(command_ws):
    rows = _study(command_ws, 16)
    ledger = Ledger(command_ws / "ledger.sqlite")
    since = _confirmed_at(rows, 0.95)
    assert since is not None, [(t.attempt, t.verdict, t.confirmation) for t in rows]
    incumbent = next(t for t in rows if t.confirmation == Confirmation.CONFIRMED and t.params["quality"] == 0.95)
    before = [t for t in rows if t.number < incumbent.number and t.proposer not in (By.BASELINE, By.CONFIRM)]
    assert all(t.status == TrialStatus.COMPLETE for t in before), before  # no incumbent yet: parent only
    later = [t for t in rows if t.number > since and t.proposer != By.CONFIRM]
    base_mid = [
        m
        for b in rows
        if b.proposer == By.BASELINE
        for m in ledger.metrics(b.id)
        if m.get("type") == "eval" and m["step"] == 2
    ]
    level = sum(sum(m["eval/id/items"]) for m in base_mid) / (100 * len(base_mid))
    stopped = spared = 0
    for t in later:
        mid = next(m for m in ledger.metrics(t.id) if m.get("type") == "eval" and m["step"] == 2)
        if t.params["quality"] < 0.95 and mid["eval/id/greedy_pass@1"] <= level:  # not ahead of its parent
            assert (t.status, t.verdict) == (TrialStatus.PRUNED, Verdict.PRUNED), t
            assert f"clearly worse than the incumbent {incumbent.attempt} at step 2" in t.reason, t.reason
            assert max(m["step"] for m in ledger.metrics(t.id)) == 2  # stopped at the middle eval
            stopped += 1
        else:  # ahead of its parent, or as good as the incumbent: runs to the end
            assert t.status == TrialStatus.COMPLETE, t
            spared += t.params["quality"] == 0.55
    assert stopped and spared, [(t.attempt, t.params, t.status) for t in later]


def test_every_decision_states_its_test_its_noise_and_its_error_rate(command_ws):
    rows = _study(command_ws, 8)
    judged = [t for t in rows if t.verdict in (Verdict.IMPROVED, Verdict.REGRESSED, Verdict.FLAT)]
    assert judged, [(t.attempt, t.status) for t in rows]
    for t in judged:
        assert "Welch-Satterthwaite t" in t.test and t.trial_sd >= t.parent_sd >= 0, t
        assert 0 <= t.fp_rate <= 0.2, t
        message = git(command_ws, "log", "-1", "--format=%B", t.end_tag)
        assert "calibrated false-positive rate" in message and percent(t.fp_rate) in message
    decided = [t for t in rows if t.confirmation in (Confirmation.CONFIRMED, Confirmation.REJECTED)]
    assert decided, [(t.attempt, t.verdict, t.confirmation) for t in rows]
    for t in decided:
        # a confirmed one states the chance that a null *candidate* is confirmed (screened on the same baseline
        # runs), a few percent with two fresh runs on 100 items; a rejected one its fresh runs' own test
        assert "97.5% two-sided" in t.confirm_test and 0 <= t.confirm_fp_rate <= 0.15, t
        last = max((r for r in rows if r.confirms == t.number), key=lambda r: r.number)
        message = git(command_ws, "log", "-1", "--format=%B", last.end_tag)  # the run that settled it says so
        assert f"{t.attempt}: {t.confirmation} by 2 fresh-seed runs" in message, message
        assert "confirmation error rate: " in message and f"{t.confirm_fp_rate:.1%}" in message, message
    show = run_cli("-C", str(command_ws), "show", str(decided[0].number))
    assert "error rate:" in show.stdout and "confirmation error rate:" in show.stdout, show.stdout
    out = command_ws / "rep"
    assert run_cli("-C", str(command_ws), "report", "--out", str(out)).returncode == 0
    page = (out / "report.md").read_text()
    assert "## Error rates" in page and "A/A: each baseline run judged against the others" in page
    assert "false confirmations expected among the trials judged" in page
