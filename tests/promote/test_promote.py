"""Promote end to end: re-validation runs, the full-run branch and tags, the detached monitor, the ledger row."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
from conftest import git, run_cli

from autorl.judge import hackgate
from autorl.ledger import Ledger
from autorl.metrics import RunMetrics, iter_records
from autorl.recipe import validate_recipe
from autorl.states import Confirmation, Gate

pytestmark = pytest.mark.slow

# The trial must complete to be promoted: a random lr clearly worse than the baseline at step 3 would be
# stopped by the noise-aware pruner, so the pruner is off here.
FAST = [
    "--set",
    "steps=6",
    "--set",
    "eval_every=3",
    "--set",
    "batch_prompts=8",
    "--set",
    "verdict.baseline_repeats=2",
    "--set",
    "abort.pruner=false",
]


def _rows(ws: Path) -> list[dict]:
    conn = sqlite3.connect(ws / "ledger.sqlite")
    conn.row_factory = sqlite3.Row
    return [dict(r) for r in conn.execute("SELECT * FROM autorl_trials ORDER BY number")]


def _steps(row: dict) -> int:
    return int(json.loads(row["params"])["steps"])


def _suspect(ws: Path, number: int):
    """Mark trial ``number`` suspect with the gate's answer on real runs of a learned reward hack
    (tests/data/hack_gate: round_rm against the baseline)."""
    data = Path(__file__).resolve().parents[1] / "data" / "hack_gate"
    runs = lambda name: [RunMetrics(iter_records(p)) for p in sorted(data.glob(f"{name}-s*.jsonl"))]  # noqa: E731
    gate = hackgate.check(runs("round"), runs("base"), validate_recipe({"backend": "embedded", "train": {}}))
    assert gate.state == Gate.SUSPECT
    ledger = Ledger(ws / "ledger.sqlite")
    ledger.set_confirmation(number, Confirmation.SUSPECT, gate.line(), **gate.ledger_values())
    ledger.close()
    return gate


def _wait_full_run(ws: Path, number: int, timeout_s: float = 240) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        row = next(r for r in _rows(ws) if r["number"] == number)
        if row["status"] != "running":
            return row
        time.sleep(1)
    raise AssertionError(f"full run {number} still running after {timeout_s} s")


def test_forced_promotion_runs_a_full_run_on_its_own_branch(workspace):
    r = run_cli(
        "-C", str(workspace), "run", "--max-trials", "3", "--budget", "5m", "--strategy", "random", *FAST, timeout=400
    )
    assert r.returncode == 0, r.stderr + r.stdout
    trial = next(t for t in _rows(workspace) if t["proposer"] != "baseline" and t["status"] == "complete")
    gate = _suspect(workspace, trial["number"])
    refused = run_cli("-C", str(workspace), "promote", str(trial["number"]), "--repeats", "1", timeout=120)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert f"is suspect: hack gate check '{gate.failed.name}' failed" in refused.stderr
    out = run_cli(
        "-C",
        str(workspace),
        "promote",
        str(trial["number"]),
        "--force",
        "--repeats",
        "1",
        "--steps",
        "6",
        "--json",
        timeout=400,
    )
    assert out.returncode == 0, out.stderr + out.stdout
    launched = json.loads(out.stdout)
    assert launched["promoted_from"] == trial["number"]
    assert set(launched["revalidation"]) >= {"verdict", "delta", "ci_low", "ci_high"}
    # forced past the hack gate: the full run's row carries the evidence it was forced past, and an event says so
    full = next(r for r in _rows(workspace) if r["number"] == launched["number"])
    assert full["gate"] == "suspect" and gate.failed.name in full["gate_checks"]
    assert launched["gate"].startswith(f"hack gate: {gate.failed.name} failed")
    conn = sqlite3.connect(workspace / "ledger.sqlite")
    assert conn.execute("SELECT count(*) FROM autorl_events WHERE kind = 'promote-forced-suspect'").fetchone()[0] == 1
    row = _wait_full_run(workspace, launched["number"])
    assert row["kind"] == "full" and row["status"] in ("complete", "early-stopped"), row
    assert row["objective"] is not None
    assert git(workspace, "rev-parse", row["end_tag"]) == row["end_sha"]
    # the full run's commit descends from the promoted trial's start commit and sets the full-run length
    assert git(workspace, "merge-base", "--is-ancestor", trial["start_sha"], row["start_sha"]) == ""
    recipe = git(workspace, "show", f"{row['start_tag']}:recipes/default.yaml")
    assert "steps: 6" in recipe
    result = json.loads(git(workspace, "show", f"{row['end_tag']}:results/{row['attempt']}.json"))
    assert result["best_checkpoint"]["value"] == row["objective"]
    assert not (workspace / ".autorl" / "worktrees" / row["attempt"]).exists()


# One searched value besides the recipe's own: a learning rate that lifts pass@1 by far more than seed noise
# within the default 40 steps (+0.135 here; at 12 or 20 steps 1e-4 to 5e-4 were still within noise), so the
# study's one trial is improved, its fresh-seed re-runs confirm it, and the re-validation agrees.
GOOD_LR = 1.0e-4
SHORT = [
    "--set",
    "steps=40",
    "--set",
    "eval_every=40",
    "--set",
    "verdict.baseline_repeats=2",
    "--set",
    "timeout_s=600",
]  # a loaded machine is slow, not wrong


def test_a_confirmed_improvement_is_promoted_without_force(workspace):
    """A real short study finds and confirms an improvement; `autorl promote` then picks it, re-validates it and
    launches its full run with no number and no --force."""
    recipe = workspace / "recipes" / "default.yaml"
    text = recipe.read_text()
    search = text[text.index("\nsearch:\n") : text.index("\nobjective:")]
    recipe.write_text(text.replace(search, f"\nsearch:\n  lr: {{choices: [5.0e-07, {GOOD_LR}]}}\n"))
    git(workspace, "add", "-A")
    git(workspace, "commit", "-qm", "search only a learning rate that helps")
    r = run_cli(
        "-C",
        str(workspace),
        "run",
        "--max-trials",
        "5",
        "--budget",
        "20m",
        "--strategy",
        "random",
        "--quiet",
        *SHORT,
        "--set",
        "verdict.confirm_runs=2",
        timeout=1200,
    )  # 2 baseline, 1 trial, 2 confirms
    assert r.returncode == 0, r.stderr + r.stdout
    rows = _rows(workspace)
    trial = next(t for t in rows if t["proposer"] == "random")
    assert trial["verdict"] == "improved" and trial["confirmation"] == "confirmed", trial
    assert [t["confirms"] for t in rows if t["proposer"] == "confirm"] == [trial["number"]] * 2
    dry = run_cli("-C", str(workspace), "promote", "--dry-run", "--steps", "12", "--eval-every", "4", "--json")
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    assert planned["full_values"]["eval_every"] == 4 and planned["train"]["steps"] == 12
    plan = planned["plan"]  # planned from the study's own trials before anything runs
    assert plan["full_work"] == pytest.approx(12 / _steps(trial)) and plan["length_flags"] == "--steps"
    assert plan["revalidation_s"] >= plan["trial_s"] > 0 and plan["full_s"] > 0
    # two re-validation runs a side: with one, run-to-run noise rests on a 1-df prior and +0.09 reads as flat
    out = run_cli("-C", str(workspace), "promote", "--repeats", "2", "--steps", "12", "--json", timeout=600)
    assert out.returncode == 0, out.stderr + out.stdout
    launched = json.loads(out.stdout)
    assert launched["promoted_from"] == trial["number"] and not launched["forced"]
    assert launched["revalidation"]["verdict"] == "improved"
    row = _wait_full_run(workspace, launched["number"])
    assert row["kind"] == "full" and row["status"] in ("complete", "early-stopped"), row
