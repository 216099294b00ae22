"""The ledger's boundary: typed rows (a write names real columns with values of their type), frozen migrations
(a fresh ledger and an old one migrated have exactly Trial's columns), and one study's records."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time

import pytest
import sqlite_utils

from autorl import ledger as L
from autorl.ledger import TRIAL_COLUMNS, Ledger, Study, Trial
from autorl.states import Confirmation, Kind, Proposer, StudyStatus, TrialStatus, Verdict

# What 0001_initial created when it shipped. A migration is never edited: a new column is a new migration.
INITIAL_TRIAL_COLUMNS = [
    "id",
    "study_id",
    "number",
    "attempt",
    "branch",
    "start_tag",
    "end_tag",
    "start_sha",
    "end_sha",
    "proposer",
    "hypothesis",
    "why",
    "params",
    "changed",
    "seed",
    "optuna_number",
    "status",
    "verdict",
    "reason",
    "objective",
    "delta",
    "ci_low",
    "ci_high",
    "method",
    "n_items",
    "flags",
    "crash_category",
    "crash_signature",
    "root_cause",
    "remedy",
    "retry_of",
    "promoted_from",
    "kind",
    "started",
    "finished",
    "duration_s",
    "log_path",
    "metrics_path",
    "exit_code",
    "pid",
]


def _columns(path, table: str) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
    finally:
        conn.close()


def _study(led: Ledger, name: str = "s") -> int:
    return led.create_study(
        name=name, recipe_path="r.yaml", recipe="", base_sha="x", strategy="random", budget_s=1.0, optuna_study=name
    )


def test_a_fresh_ledger_has_exactly_the_typed_columns(tmp_path):
    Ledger(tmp_path / "l.sqlite").close()
    assert sorted(_columns(tmp_path / "l.sqlite", "autorl_trials")) == sorted(TRIAL_COLUMNS)
    assert sorted(_columns(tmp_path / "l.sqlite", "autorl_studies")) == sorted(
        f.name for f in dataclasses.fields(Study)
    )


def test_the_first_migration_is_frozen(tmp_path):
    db = sqlite_utils.Database(tmp_path / "old.sqlite")
    L.migrations.MIGRATIONS[0][1](db)
    assert _columns(tmp_path / "old.sqlite", "autorl_trials") == INITIAL_TRIAL_COLUMNS


def test_an_old_ledger_is_migrated_with_its_rows(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite_utils.Database(path)
    db.execute("CREATE TABLE autorl_migrations (name TEXT PRIMARY KEY, applied REAL)")
    for name, step in L.migrations.MIGRATIONS[:2]:  # a ledger from before gap_to_best
        step(db)
        db.execute("INSERT INTO autorl_migrations VALUES (?, ?)", [name, time.time()])
    db["autorl_studies"].insert({"id": 1, "name": "s", "status": "stopped"})
    db["autorl_trials"].insert({"id": 1, "study_id": 1, "number": 1, "attempt": "attempt-01", "params": '{"lr": 0.1}'})
    db.conn.commit()
    db.close()
    led = Ledger(path)
    assert sorted(_columns(path, "autorl_trials")) == sorted(TRIAL_COLUMNS)
    row = led.trial(1)
    assert row.params == {"lr": 0.1} and row.gap_to_best is None and row.confirmation is None


def test_a_write_names_real_columns_with_values_of_their_type(tmp_path):
    led = Ledger(tmp_path / "l.sqlite")
    sid = _study(led)
    tid = led.add_trial(study_id=sid, number=1, attempt="attempt-01", params={"lr": 1e-3}, started=5, seed=3)
    row = led.trial(1)
    assert row.params == {"lr": 1e-3} and row.started == 5.0 and isinstance(row.started, float)
    with pytest.raises(ValueError, match="unknown key 'objectiv'"):
        led.update_trial(tid, objectiv=0.5)
    with pytest.raises(ValueError, match="objective"):
        led.update_trial(tid, status="complete", objective="high")
    with pytest.raises(ValueError, match="budget_s"):
        led.update_study(sid, budget_s="an hour")
    assert led.trial(1).status == "running" and led.trial(1).objective is None  # nothing half-written


def test_study_records_are_one_studys_rows(tmp_path):
    led = Ledger(tmp_path / "l.sqlite")
    a, b = _study(led, "a"), _study(led, "b")
    for number, sid, proposer in ((1, a, "baseline"), (2, b, "baseline"), (3, a, "random"), (4, b, "random")):
        led.add_trial(
            study_id=sid,
            number=number,
            attempt=f"attempt-{number:02d}",
            proposer=proposer,
            status="complete",
            objective=0.1 * number,
        )
    records = led.records(a)
    assert [t.number for t in records.trials()] == [1, 3]
    assert [t.number for t in records.baselines()] == [1]
    assert [t.number for t in records.scored()] == [1, 3]
    records.event(None, "note", "only a's")
    assert [e.message for e in led.events(a)][0] == "only a's" and not [e for e in led.events(b) if e.kind == "note"]


# ---- one study's rows, kept in memory and current with the file ------------------------------------------------
def _grown(led: Ledger, sid: int, n: int, start: int = 1) -> None:
    for number in range(start, start + n):
        tid = led.add_trial(
            study_id=sid,
            number=number,
            attempt=f"attempt-{number:02d}",
            proposer="optuna",
            params={"lr": number * 1e-4},
            started=float(number),
        )
        led.update_trial(tid, status="complete", objective=0.5, finished=number + 0.5)


def _questions(records) -> None:
    """What a running study asks at every trial (proposer, planner, pruner, verdict)."""
    records.trials(kind="trial"), records.baselines(), records.scored(), records.confirmed()
    records.confirm_groups(), records.crash_signatures(), records.best_objective(True), records.finished(last=12)
    records.first_end(), records.ran({"lr": 1.0}), records.trial(1), records.unretried_crashes()


def test_a_trial_costs_the_same_rows_read_however_long_the_study(tmp_path, monkeypatch):
    """Each trial of a study re-read all its rows, many times over (0.54 s of overhead a trial at the start of a
    soak, 0.94 s after 1,687 trials). Now rows are read once, then only those a write changed; questions asked
    between two writes read nothing. Counted as trial rows decoded from the file, for a study of 10 and of 300."""
    decoded = []
    real = L.rows.decode
    for module in (L.store, L.views):  # every read of a trial row decodes it
        monkeypatch.setattr(module, "decode", lambda row: decoded.append(row.get("number")) or real(row))
    led = Ledger(tmp_path / "l.sqlite")
    sid = _study(led)
    records = led.records(sid)
    per_trial = []
    for size in (10, 300):
        _grown(led, sid, size - len(records.trials()), start=len(records.trials()) + 1)
        _questions(records)
        before = len(decoded)
        _grown(led, sid, 1, start=size + 1)  # one more trial: opened, then closed
        for _ in range(5):
            _questions(records)
        per_trial.append(len(decoded) - before)
    assert per_trial == [1, 1], per_trial  # the one row that changed, once
    led.event(sid, None, "note", "a write elsewhere in the file")  # no trial row changed: nothing read again
    _questions(records)
    assert len(decoded) == before + 1


def test_a_row_another_connection_writes_is_seen_at_the_next_question(tmp_path):
    """Another study's controller, a --parallel slot or an older autorl writing with plain SQL: SQLite's
    data_version says something changed, the revision says what."""
    path = tmp_path / "l.sqlite"
    led = Ledger(path)
    sid = _study(led)
    _grown(led, sid, 3)
    records = led.records(sid)
    assert [t.objective for t in records.scored()] == [0.5, 0.5, 0.5]
    other = Ledger(path)  # a second connection, as another process has
    other.update_trial(other.trial(2).id, objective=0.9, confirmation="confirmed")
    other.add_trial(study_id=sid, number=4, attempt="attempt-04", proposer="baseline")
    assert [t.objective for t in records.scored()] == [0.5, 0.9, 0.5]
    assert [t.number for t in records.confirmed()] == [2] and [t.number for t in records.baselines()] == [4]
    raw = sqlite3.connect(path)  # plain SQL, no autorl: the ledger's triggers still mark the row
    raw.execute("UPDATE autorl_trials SET status = 'crash', verdict = 'crash', crash_signature = 'x' WHERE number = 3")
    raw.commit()
    raw.close()
    assert [t.number for t in records.crash_signatures()] == [3] and records.trial(3).status == "crash"
    assert [t.number for t in led.records(sid).trials()] == [t.number for t in records.trials()]
    other.close()


def test_study_records_answer_as_the_ledgers_sql_does(tmp_path):
    """The queries over the rows in memory keep SQL's meaning: a crashed baseline's retry stands in for it, a
    confirmation or retry the controller stopped early did not run, None equals nothing."""
    led = Ledger(tmp_path / "l.sqlite")
    sid, other = _study(led, "a"), _study(led, "b")
    rows = [
        (1, "baseline", {"status": "crash", "verdict": "crash", "crash_signature": "oom"}),
        (2, "retry", {"retry_of": 1, "status": "complete", "objective": 0.4}),
        (3, "baseline", {"status": "complete", "objective": 0.5}),
        (4, "optuna", {"status": "complete", "objective": 0.7, "verdict": "improved", "confirmation": "candidate"}),
        (5, "confirm", {"confirms": 4, "status": "interrupted"}),
        (6, "confirm", {"confirms": 4, "status": "complete", "objective": 0.6}),
        (7, "optuna", {"status": "crash", "verdict": "crash", "crash_signature": "nan"}),
        (8, "retry", {"retry_of": 7, "status": "budget-cut"}),
        (9, "optuna", {"status": "crash", "verdict": "crash"}),
        (10, "promote", {"kind": "full", "status": "complete", "objective": 0.9}),
    ]
    for number, proposer, values in rows:
        led.add_trial(study_id=sid, number=number, attempt=f"attempt-{number:02d}", proposer=proposer, **values)
    led.add_trial(study_id=other, number=11, attempt="attempt-11", proposer="baseline", status="complete")
    records = led.records(sid)
    numbers = lambda got: [t.number for t in got]  # noqa: E731
    assert numbers(records.baselines()) == numbers(led.baselines(sid)) == [2, 3]
    assert numbers(records.unretried_crashes()) == [7, 9]
    assert numbers(records.confirm_runs(4)) == [5, 6] and numbers(records.confirm_runs(4, ran=True)) == [6]
    assert {k: numbers(v) for k, v in records.confirm_groups().items()} == {4: [6]}
    assert numbers(records.scored()) == [2, 3, 4, 6] and records.best_objective(True) == 0.7
    assert records.best_objective(False) == 0.4
    assert numbers(records.crash_signatures()) == [1, 7] and numbers(records.open_candidates()) == [4]
    assert numbers(records.trials(crash_signature=None)) == [] and numbers(records.trials(kind="full")) == [10]
    assert numbers(records.finished(last=2)) == [] and records.first_end() is None
    assert records.trial(11).study_id == other  # another study's trial: read from the file
    with pytest.raises(ValueError, match="no trial column"):
        records.trials(colour="red")


def test_what_a_caller_gets_cannot_change_the_kept_rows_and_a_transaction_is_never_cached(tmp_path):
    led = Ledger(tmp_path / "l.sqlite")
    sid = _study(led)
    _grown(led, sid, 2)
    records = led.records(sid)
    got = records.trials()
    with pytest.raises(dataclasses.FrozenInstanceError):
        got[0].status = TrialStatus.CRASH  # type: ignore[misc]
    changed = got[1].replace(params={}, status=TrialStatus.CRASH)
    assert (changed.params, changed.status, got[1].status) == ({}, TrialStatus.CRASH, TrialStatus.COMPLETE)
    assert [t.status for t in records.trials()] == [TrialStatus.COMPLETE, TrialStatus.COMPLETE]
    assert records.ran({"lr": 2e-4}).number == 2
    with pytest.raises(RuntimeError):
        with led.tx():
            led.db["autorl_trials"].update(records.trial(1).id, {"status": "crash"})
            assert records.trial(1).status == TrialStatus.CRASH  # read afresh inside the transaction
            raise RuntimeError("rolled back")
    assert records.trial(1).status == TrialStatus.COMPLETE
    with pytest.raises(ValueError, match="rev"):
        led.update_trial(records.trial(1).id, rev=10**9)  # the triggers keep it, never a caller


def test_rows_come_back_typed_with_their_states_as_enums(tmp_path):
    led = Ledger(tmp_path / "l.sqlite")
    sid = _study(led)
    tid = led.add_trial(study_id=sid, number=1, attempt="attempt-01", params={"lr": 0.1}, proposer=Proposer.BASELINE)
    led.update_trial(tid, status="complete", verdict=Verdict.IMPROVED, confirmation="candidate", objective=0.5)
    row = led.trial(1)
    assert isinstance(row, Trial) and row.params == {"lr": 0.1} and row.objective == 0.5
    assert (row.status, row.verdict, row.confirmation, row.proposer, row.kind) == (
        TrialStatus.COMPLETE,
        Verdict.IMPROVED,
        Confirmation.CANDIDATE,
        Proposer.BASELINE,
        Kind.TRIAL,
    )
    assert f"{row.verdict}" == "improved" and row.as_dict()["verdict"] == "improved"
    assert json.loads(json.dumps(row.as_dict()))["status"] == "complete"
    assert led.study(study_id=sid).status == StudyStatus.RUNNING
    with pytest.raises(ValueError, match="verdict"):
        led.update_trial(tid, verdict="improvd")  # a misspelt state is refused where it is written


def test_a_ledger_from_before_revisions_gets_them(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite_utils.Database(path)
    db.execute("CREATE TABLE autorl_migrations (name TEXT PRIMARY KEY, applied REAL)")
    for name, step in L.migrations.MIGRATIONS[:-1]:
        step(db)
        db.execute("INSERT INTO autorl_migrations VALUES (?, ?)", [name, time.time()])
    db["autorl_studies"].insert({"id": 1, "name": "s", "status": "stopped"})
    for n in (1, 2):
        db["autorl_trials"].insert({"id": n, "study_id": 1, "number": n, "attempt": f"attempt-0{n}", "kind": "trial"})
    db.conn.commit()
    db.close()
    led = Ledger(path)
    records = led.records(1)
    assert [t.rev for t in records.trials()] == [1, 2]
    led.update_trial(1, status="complete")
    assert [(t.number, t.rev) for t in records.trials()] == [(1, 3), (2, 2)]


def _answers(records, count: int) -> dict:
    numbers = lambda got: [t.number for t in got]  # noqa: E731
    by_number = [records.trial(n).status for n in range(1, count + 1)]  # asked first: it must see the file too
    return {
        "by_number": by_number,
        "trials": records.trials(),
        "kind": numbers(records.trials(kind="trial")),
        "complete": numbers(records.trials(status="complete")),
        "baselines": numbers(records.baselines()),
        "scored": numbers(records.scored()),
        "best": (records.best_objective(True), records.best_objective(False)),
        "finished": numbers(records.finished(last=3)),
        "first": records.first_end(),
        "signatures": numbers(records.crash_signatures()),
        "confirmed": numbers(records.confirmed()),
        "candidates": numbers(records.open_candidates()),
        "unretried": numbers(records.unretried_crashes()),
        "runs": [(numbers(records.confirm_runs(c)), numbers(records.confirm_runs(c, ran=True))) for c in (1, 2, 3)],
        "groups": {k: numbers(v) for k, v in records.confirm_groups().items()},
        "ran": [getattr(records.ran({"lr": lr, "seed": seed}), "number", None) for lr in (1, 2) for seed in (0, 1, 2)],
    }


def test_rows_kept_up_to_date_row_by_row_answer_as_rows_read_afresh(tmp_path):
    """Random inserts and updates, from this connection and from another: after each, every query of a study's
    long-lived records (its views brought up to date one changed row at a time) equals that of records that read
    every row afresh."""
    import random

    from autorl.runs import plan

    path = tmp_path / "l.sqlite"
    led, other = Ledger(path), None
    sid = _study(led)
    other = Ledger(path)
    kept = led.records(sid)
    rng = random.Random(7)
    pick = lambda *xs: rng.choice(xs)  # noqa: E731
    for step in range(600):
        writer = pick(led, other)
        n = len(kept.trials())
        if n < 3 or rng.random() < 0.4:
            writer.add_trial(
                study_id=sid,
                number=n + 1,
                attempt=f"attempt-{n + 1:02d}",
                kind=pick("trial", "trial", "full"),
                proposer=pick("baseline", "optuna", "retry", "confirm"),
                params={"lr": pick(1, 2), "seed": pick(0, 1, 2)},
                retry_of=pick(None, None, rng.randint(1, n + 1)),
                confirms=pick(None, None, None, 1, 2, 3),
                started=pick(None, rng.random()),
            )
        else:
            row = writer.trial(rng.randint(1, n))
            writer.update_trial(
                row.id,
                **rng.choice(
                    [
                        {
                            "status": pick("complete", "crash", "interrupted", "budget-cut", "running"),
                            "finished": rng.random(),
                        },
                        {"retry_of": pick(None, rng.randint(1, n))},
                        {"proposer": pick("baseline", "optuna", "retry")},
                        {"objective": pick(None, rng.random())},
                        {"confirmation": pick("candidate", "confirmed", None)},
                        {"verdict": "crash", "crash_signature": pick("a", None)},
                        {"params": {"lr": pick(1, 2), "seed": pick(0, 1, 2)}},
                    ]
                ),
            )
        count = led.max_number()
        assert _answers(kept, count) == _answers(led.records(sid), count), step
        assert (
            plan.history(kept.finished(last=3), ["lr"], first_end=kept.first_end())
            == plan.history(kept.trials(kind="trial"), ["lr"])[-3:]
        ), step  # what the planner reads: its window, and the first end
    assert kept.rows.rows_read <= 600  # each changed row once
