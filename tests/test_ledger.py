"""The ledger's boundary: typed rows (a write names real columns with values of their type), frozen migrations
(a fresh ledger and an old one migrated have exactly TrialRow's columns), and one study's records."""

from __future__ import annotations

import sqlite3
import time

import pytest
import sqlite_utils

from autorl import ledger as L
from autorl.ledger import TRIAL_COLUMNS, Ledger, StudyRow

# What 0001_initial created when it shipped. A migration is never edited: a new column is a new migration.
INITIAL_TRIAL_COLUMNS = [
    "id", "study_id", "number", "attempt", "branch", "start_tag", "end_tag", "start_sha", "end_sha", "proposer",
    "hypothesis", "why", "params", "changed", "seed", "optuna_number", "status", "verdict", "reason", "objective",
    "delta", "ci_low", "ci_high", "method", "n_items", "flags", "crash_category", "crash_signature", "root_cause",
    "remedy", "retry_of", "promoted_from", "kind", "started", "finished", "duration_s", "log_path", "metrics_path",
    "exit_code", "pid"]


def _columns(path, table: str) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
    finally:
        conn.close()


def _study(led: Ledger, name: str = "s") -> int:
    return led.create_study(name=name, recipe_path="r.yaml", recipe="", base_sha="x", strategy="random",
                            budget_s=1.0, optuna_study=name)


def test_a_fresh_ledger_has_exactly_the_typed_columns(tmp_path):
    Ledger(tmp_path / "l.sqlite").close()
    assert sorted(_columns(tmp_path / "l.sqlite", "autorl_trials")) == sorted(TRIAL_COLUMNS)
    assert sorted(_columns(tmp_path / "l.sqlite", "autorl_studies")) == sorted(StudyRow.__annotations__)


def test_the_first_migration_is_frozen(tmp_path):
    db = sqlite_utils.Database(tmp_path / "old.sqlite")
    L.MIGRATIONS[0][1](db)
    assert _columns(tmp_path / "old.sqlite", "autorl_trials") == INITIAL_TRIAL_COLUMNS


def test_an_old_ledger_is_migrated_with_its_rows(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite_utils.Database(path)
    db.execute("CREATE TABLE autorl_migrations (name TEXT PRIMARY KEY, applied REAL)")
    for name, step in L.MIGRATIONS[:2]:  # a ledger from before gap_to_best
        step(db)
        db.execute("INSERT INTO autorl_migrations VALUES (?, ?)", [name, time.time()])
    db["autorl_studies"].insert({"id": 1, "name": "s", "status": "stopped"})
    db["autorl_trials"].insert({"id": 1, "study_id": 1, "number": 1, "attempt": "attempt-01", "params": '{"lr": 0.1}'})
    db.conn.commit()
    db.close()
    led = Ledger(path)
    assert sorted(_columns(path, "autorl_trials")) == sorted(TRIAL_COLUMNS)
    row = led.trial(1)
    assert row["params"] == {"lr": 0.1} and row["gap_to_best"] is None and row["confirmation"] is None


def test_a_write_names_real_columns_with_values_of_their_type(tmp_path):
    led = Ledger(tmp_path / "l.sqlite")
    sid = _study(led)
    tid = led.add_trial(study_id=sid, number=1, attempt="attempt-01", params={"lr": 1e-3}, started=5, seed=3)
    row = led.trial(1)
    assert row["params"] == {"lr": 1e-3} and row["started"] == 5.0 and isinstance(row["started"], float)
    with pytest.raises(ValueError, match="unknown key 'objectiv'"):
        led.update_trial(tid, objectiv=0.5)
    with pytest.raises(ValueError, match="objective"):
        led.update_trial(tid, status="complete", objective="high")
    with pytest.raises(ValueError, match="budget_s"):
        led.update_study(sid, budget_s="an hour")
    assert led.trial(1)["status"] == "running" and led.trial(1)["objective"] is None  # nothing half-written


def test_study_records_are_one_studys_rows(tmp_path):
    led = Ledger(tmp_path / "l.sqlite")
    a, b = _study(led, "a"), _study(led, "b")
    for number, sid, proposer in ((1, a, "baseline"), (2, b, "baseline"), (3, a, "random"), (4, b, "random")):
        led.add_trial(study_id=sid, number=number, attempt=f"attempt-{number:02d}", proposer=proposer,
                      status="complete", objective=0.1 * number)
    records = led.records(a)
    assert [t["number"] for t in records.trials()] == [1, 3]
    assert [t["number"] for t in records.baselines()] == [1]
    assert [t["number"] for t in records.scored()] == [1, 3]
    records.event(None, "note", "only a's")
    assert [e["message"] for e in led.events(a)][0] == "only a's" and not [e for e in led.events(b)
                                                                          if e["kind"] == "note"]
