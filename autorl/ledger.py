"""ledger.sqlite: the one record of every study, trial, metric and event.

All SQL lives here. Tables are prefixed ``autorl_`` so Optuna's own tables (its RDB
storage lives in the same file, so ``optuna-dashboard sqlite:///ledger.sqlite``
opens the study) never collide. WAL mode, and one transaction per state change:
a kill at any instant leaves a ledger that opens, passes ``PRAGMA
integrity_check`` and resumes. The schema is versioned by ``MIGRATIONS``
(recorded in ``autorl_migrations``).

The file is watched as well as written. A ledger remembers the file it opened (device and inode): every
transaction first checks that the path still names that file, so a ledger removed or replaced while a study runs
stops the study before anything more is written (``check``; Optuna's storage opens the file without ever creating
it, ``optuna_url``). Creating and migrating a ledger, creating Optuna's tables and numbering an attempt take
the ledger's lock (``exclusive``: the file ``<ledger>-lock``), so studies started at once share one ledger
safely. The review commands open it read-only (``Ledger.open_read``). Any SQLite failure, whichever query meets
it, is one ``LedgerError`` line (``DiskFullError`` for a full disk) that says what to do, and never to delete a
ledger that can still be read.
"""

from __future__ import annotations

import bisect
import functools
import json
import os
import shutil
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, TypedDict, get_type_hints
from urllib.parse import quote

import sqlite_utils
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from autorl import locks
from autorl.errors import DiskFullError, LedgerError, NotFoundError, WorkspaceError, short, validation_line

class TrialRow(TypedDict, total=False):
    """One row of ``autorl_trials`` as the ledger writes and reads it: each column's type and meaning (docs/ledger.md
    is generated from this table). Writes are validated against it; JSON columns come back decoded."""

    id: Annotated[int | None, 'Row id.']
    study_id: Annotated[int | None, 'The study this trial belongs to.']
    number: Annotated[int | None, 'Attempt number NN (unique per workspace).']
    attempt: Annotated[str | None, 'Attempt name = branch, e.g. attempt-07-lr-3e-4.']
    branch: Annotated[str | None, 'Git branch of the trial.']
    start_tag: Annotated[str | None, 'Tag on the commit the trial ran (attempt-NN-start).']
    end_tag: Annotated[str | None, 'Tag on the commit with its results (attempt-NN-end).']
    start_sha: Annotated[str | None, 'Commit SHA the trial ran.']
    end_sha: Annotated[str | None, 'Commit SHA with the results file and research-log entry.']
    proposer: Annotated[str | None, "Who proposed it: baseline, optuna, random, hypothesis (ranked), move (a "
                        "direction-aware move rule, autorl/data/rules/moves.yaml), confirm, retry, promote."]
    hypothesis: Annotated[str | None, 'Hypothesis id tested (NULL for plain search).']
    why: Annotated[str | None, 'Why it was chosen (the diagnosis that led there).']
    params: Annotated[dict[str, Any] | None, 'JSON of the full train block run.']
    changed: Annotated[dict[str, Any] | None, 'JSON of the values that differ from the baseline recipe.']
    seed: Annotated[int | None, 'Seed the trial ran with.']
    optuna_number: Annotated[int | None, "Optuna trial number (join key with Optuna's tables)."]
    status: Annotated[str | None, 'running, complete, pruned, crash, budget-cut, interrupted, timeout, config-error.']
    verdict: Annotated[str | None, 'improved, regressed, flat, crash, pruned (NULL while running or for a baseline).']
    reason: Annotated[str | None, 'One line: why this status/verdict.']
    objective: Annotated[float | None, 'Objective value (NULL for a crash; never a placeholder).']
    delta: Annotated[float | None, "Gain over the trial's parent (the recipe it modifies), better-is-positive."]
    gap_to_best: Annotated[float | None, "Objective minus the best objective of the study's earlier trials (the "
                           "incumbent), better-is-positive."]
    ci_low: Annotated[float | None, 'Lower end of the interval for delta.']
    ci_high: Annotated[float | None, 'Upper end of the interval for delta.']
    parent: Annotated[int | None, 'Attempt number of the parent the trial was judged against (NULL = the baseline).']
    gain_vs_baseline: Annotated[float | None, "Gain over the study's original baseline, reported apart from the "
                                "verdict."]
    confirmation: Annotated[str | None, "For an improved trial: candidate, confirmed or rejected (fresh-seed re-runs "
                            "decide), or suspect (confirmed, but the hack gate failed: see gate_checks)."]
    confirms: Annotated[int | None, 'Attempt number of the candidate this confirmation run re-runs.']
    method: Annotated[str | None, 'How the interval was computed.']
    n_items: Annotated[int | None, 'Eval items (or repeats) behind the interval.']
    flags: Annotated[list[dict[str, Any]] | None, 'JSON list of flags with evidence (divergence, truncation, ...).']
    crash_category: Annotated[str | None, 'Triage category of a crash.']
    crash_action: Annotated[str | None, "What triage decided for a crash: retry_reduced, retry_once, record or stop "
                            "(a retry not yet run when the controller stopped is queued again on resume)."]
    crash_signature: Annotated[str | None, 'Stable signature grouping identical failures.']
    root_cause: Annotated[str | None, 'The log line a person would point at.']
    remedy: Annotated[str | None, 'What to do about the crash.']
    test: Annotated[str | None, "The test behind the verdict: what it compares, the t distribution's df and the "
                    "interval's level."]
    trial_sd: Annotated[float | None, "Run-to-run sd the verdict assumed for the trial's recipe (never below the "
                        "parent's; larger where the trial's own runs or the study's other changed recipes showed "
                        "more)."]
    parent_sd: Annotated[float | None, "Run-to-run sd the verdict assumed for the parent's recipe (its replicate runs "
                         "with the prior)."]
    fp_rate: Annotated[float | None, "Calibrated false-positive rate of the verdict: the share of no-effect trials its "
                       "test calls what it called this one (improved or regressed; flat: either), simulated at the "
                       "noise it assumed."]
    confirm_test: Annotated[str | None, "The test behind a candidate's confirmation (its fresh-seed runs)."]
    confirm_trial_sd: Annotated[float | None, "Run-to-run sd the confirmation assumed for the candidate's recipe."]
    confirm_parent_sd: Annotated[float | None, "Run-to-run sd the confirmation assumed for the parent's recipe."]
    confirm_fp_rate: Annotated[float | None, "Calibrated false-positive rate of the confirmation: the share of "
                               "no-effect candidates its test confirms (rejected: the same share), at the noise it "
                               "assumed."]
    gate: Annotated[str | None, "The hack gate at confirmation (and on a full run, at promote): ok, suspect (a check "
                    "failed) or blind (no held-out task metric to check against)."]
    gate_checks: Annotated[list[dict[str, Any]] | None, "JSON list of the hack gate's checks: name, ok "
                           "(true/false/null = not measured), detail and the numbers behind it."]
    retry_of: Annotated[int | None, 'Attempt number of the crashed trial this retries.']
    promoted_from: Annotated[int | None, 'Attempt number a full run was promoted from.']
    kind: Annotated[str | None, 'trial or full.']
    started: Annotated[float | None, 'Unix time the trial started.']
    finished: Annotated[float | None, 'Unix time it ended.']
    duration_s: Annotated[float | None, 'Wall seconds.']
    first_step: Annotated[float | None, "Unix time the trial's first training step was logged: what came before it "
                          "(process and job start-up, model load) does not grow with the trial's work."]
    log_path: Annotated[str | None, "The run's log file."]
    metrics_path: Annotated[str | None, "The run's metrics JSONL."]
    exit_code: Annotated[int | None, 'Exit code of the run (NULL if it never exited).']
    pid: Annotated[int | None, 'Process group of the running trial (for cleanup on resume).']
    job_id: Annotated[str | None, 'Ray job id of the running trial (for cleanup on resume).']
    job_address: Annotated[str | None, 'Ray dashboard address the job was submitted to.']
    rev: Annotated[int | None, "Revision: set by the ledger's triggers on every insert and update of the row, higher "
                   "than any revision before it, so a running study re-reads only the rows that changed (never "
                   "written by autorl's code)."]


class StudyRow(TypedDict, total=False):
    """One row of ``autorl_studies``."""

    id: int | None
    name: str | None
    recipe_path: str | None
    recipe: str | None
    base_sha: str | None
    strategy: str | None
    budget_s: float | None
    created: float | None
    status: str | None
    optuna_study: str | None
    baseline_value: float | None
    base_changes: dict[str, Any] | None


TRIAL_COLUMNS: dict[str, str] = {k: h.__metadata__[0] for k, h in get_type_hints(TrialRow, include_extras=True).items()}
_JSON_COLUMNS = ("params", "changed", "flags", "base_changes", "gate_checks")


def _write_model(row: type, kept_by_sqlite: tuple[str, ...] = ()) -> type[BaseModel]:
    """The pydantic model a write to ``row``'s table is validated by (an unknown column is an error, and so is one
    that SQLite itself keeps, ``kept_by_sqlite``)."""
    fields = {k: (h, None) for k, h in get_type_hints(row).items() if k not in kept_by_sqlite}
    return create_model(f"{row.__name__}Write", __config__=ConfigDict(extra="forbid"), **fields)


_TRIAL_WRITE, _STUDY_WRITE = _write_model(TrialRow, kept_by_sqlite=("rev",)), _write_model(StudyRow)


# ---- migrations: each one frozen as it shipped (a new column is a new migration, never an edit of an old one) ----
def _v1(db: sqlite_utils.Database) -> None:
    db["autorl_studies"].create({
        "id": int, "name": str, "recipe_path": str, "recipe": str, "base_sha": str,
        "strategy": str, "budget_s": float, "created": float, "status": str,
        "optuna_study": str, "baseline_value": float,
    }, pk="id")
    db["autorl_studies"].create_index(["name"], unique=True)
    db["autorl_trials"].create({
        "id": int, "study_id": int, "number": int, "attempt": str, "branch": str, "start_tag": str, "end_tag": str,
        "start_sha": str, "end_sha": str, "proposer": str, "hypothesis": str, "why": str, "params": str,
        "changed": str, "seed": int, "optuna_number": int, "status": str, "verdict": str, "reason": str,
        "objective": float, "delta": float, "ci_low": float, "ci_high": float, "method": str, "n_items": int,
        "flags": str, "crash_category": str, "crash_signature": str, "root_cause": str, "remedy": str,
        "retry_of": int, "promoted_from": int, "kind": str, "started": float, "finished": float,
        "duration_s": float, "log_path": str, "metrics_path": str, "exit_code": int, "pid": int,
    }, pk="id", foreign_keys=[("study_id", "autorl_studies")])
    db["autorl_trials"].create_index(["number"], unique=True)
    db["autorl_metrics"].create({"trial_id": int, "step": int, "type": str, "data": str},
                                foreign_keys=[("trial_id", "autorl_trials")])
    db["autorl_metrics"].create_index(["trial_id", "step"])
    db["autorl_events"].create({"id": int, "time": float, "study_id": int, "trial_id": int,
                                "kind": str, "message": str}, pk="id")


def _v2(db: sqlite_utils.Database) -> None:
    db["autorl_trials"].add_column("job_id", str)
    db["autorl_trials"].add_column("job_address", str)


def _v3(db: sqlite_utils.Database) -> None:
    db["autorl_trials"].add_column("gap_to_best", float)


def _v4(db: sqlite_utils.Database) -> None:
    for col, kind in (("parent", int), ("gain_vs_baseline", float), ("confirmation", str), ("confirms", int)):
        db["autorl_trials"].add_column(col, kind)


def _v5(db: sqlite_utils.Database) -> None:
    db["autorl_trials"].add_column("crash_action", str)
    db["autorl_studies"].add_column("base_changes", str)


def _v6(db: sqlite_utils.Database) -> None:
    for col, kind in (("test", str), ("trial_sd", float), ("parent_sd", float), ("fp_rate", float),
                      ("confirm_test", str), ("confirm_trial_sd", float), ("confirm_parent_sd", float),
                      ("confirm_fp_rate", float)):
        db["autorl_trials"].add_column(col, kind)


def _v7_hack_gate(db: sqlite_utils.Database) -> None:
    db["autorl_trials"].add_column("gate", str)
    db["autorl_trials"].add_column("gate_checks", str)


def _v8_first_step(db: sqlite_utils.Database) -> None:
    db["autorl_trials"].add_column("first_step", float)


def _v9_revisions(db: sqlite_utils.Database) -> None:
    """``rev``: every insert or update of a trial row gives it the next revision (one past the highest; writers
    take turns, so revisions grow in commit order). A reader that has seen revisions up to R re-reads only rows
    above R, whichever process wrote them. The guard ``NEW.rev IS OLD.rev`` keeps the trigger's own update from
    firing again."""
    db["autorl_trials"].add_column("rev", int)
    db.execute("UPDATE autorl_trials SET rev = id")
    db["autorl_trials"].create_index(["rev"])
    bump = ("UPDATE autorl_trials SET rev = (SELECT coalesce(max(rev), 0) + 1 FROM autorl_trials) "
            "WHERE id = NEW.id;")
    db.execute(f"CREATE TRIGGER autorl_trials_rev_insert AFTER INSERT ON autorl_trials BEGIN {bump} END")
    db.execute("CREATE TRIGGER autorl_trials_rev_update AFTER UPDATE ON autorl_trials WHEN NEW.rev IS OLD.rev "
               f"BEGIN {bump} END")


MIGRATIONS = [("0001_initial", _v1), ("0002_ray_jobs", _v2), ("0003_gap_to_best", _v3), ("0004_confirmation", _v4),
              ("0005_resume_queue", _v5), ("0006_error_rates", _v6), ("0007_hack_gate", _v7_hack_gate),
              ("0008_first_step", _v8_first_step), ("0009_revisions", _v9_revisions)]
# A run the controller stopped (Ctrl-C, a kill recovered on resume, the budget's end) did not reach its own end:
# a confirmation or retry stopped that way is run again on resume.
STOPPED_EARLY = ("interrupted", "budget-cut")


class LedgerFile:
    """The file a ledger opened: which file it is (``check``), its lock (``exclusive``), its whole-file check
    (``verify``) and how Optuna opens it (``optuna_url``, ``create_optuna_tables``)."""

    def __init__(self, path: Path, readonly: bool):
        self.path, self.readonly = path, readonly
        self.identity: tuple[int, int] | None = None

    def remember(self) -> None:
        """This is the file the ledger opened (its device and inode)."""
        self.identity = _identity(self.path)

    @contextmanager
    def exclusive(self, what: str = "write the ledger") -> Iterator[None]:
        """The ledger's lock for the ``with`` block: one process at a time creates or migrates the ledger, creates
        Optuna's tables, numbers an attempt."""
        with locks.waiting(Path(f"{self.path}-lock"), what):
            yield

    def check(self) -> None:
        """Raise ``LedgerError`` if the path no longer names the file this ledger opened (removed, replaced)."""
        now = _identity(self.path)
        if now != self.identity:
            how = "was removed" if now is None else "was replaced by another file"
            raise LedgerError(f"ledger {short(self.path, 200)} {how} while this study ran: the study stopped and "
                              "wrote nothing more; put the ledger back, then `autorl run --resume` (a trial that "
                              "was running is recovered then)")

    def verify(self, db: sqlite_utils.Database) -> float:
        """``PRAGMA quick_check`` of the whole file (every page, not only the header); returns its seconds."""
        t0 = time.monotonic()
        with _translated_errors(self.path):
            rows = [r[0] for r in db.execute("PRAGMA quick_check(3)").fetchall()]
        if rows != ["ok"]:
            raise damaged(self.path, "; ".join(rows)[:200])
        return time.monotonic() - t0

    def optuna_url(self) -> str:
        """The SQLAlchemy URL of this file for Optuna: it never creates the file (a removed ledger is not
        re-created empty), and is read-only for a read-only ledger."""
        mode = "ro" if self.readonly else "rw"
        return f"sqlite:///file:{quote(quote(str(self.path.resolve())))}?mode={mode}&uri=true"

    def create_optuna_tables(self) -> None:
        """Optuna's tables in this file, created by one process at a time (Optuna creates them on first use)."""
        import logging

        import optuna

        optuna.logging.set_verbosity(logging.WARNING)
        with self.exclusive("create Optuna's tables"), _translated_errors(self.path):
            self.check()
            storage = optuna.storages.RDBStorage(self.optuna_url(), engine_kwargs={"connect_args": {"timeout": 30}})
            storage.engine.dispose()


class Ledger:
    """The ledger of one workspace. Every write is one transaction; ``records(study_id)`` is one study's face;
    ``file`` is the file it opened."""

    def __init__(self, path: str | Path, readonly: bool = False):
        self.path = Path(path)
        self.file = LedgerFile(self.path, readonly)
        if readonly:
            self.db = _open_read(self.path)
            self.file.remember()
            return
        _check_path(self.path)
        with self.file.exclusive("create or migrate the ledger"), _translated_errors(self.path):
            self.db = _open(self.path)
            self.file.remember()
            _migrate(self.db, self.tx)

    @contextmanager
    def tx(self) -> Iterator[None]:
        """One IMMEDIATE transaction (rolled back on any error; the rollback never hides that error), on the file
        this ledger opened (``LedgerFile.check``)."""
        conn = self.db.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            self.file.check()
            yield
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # SQLite rolled back already (a full disk); the error that got here is the one to tell
            raise

    def records(self, study_id: int) -> "StudyRecords":
        """The rows of study ``study_id``, and the queries a running study asks of them."""
        return StudyRecords(self, study_id)

    # ---- studies ----------------------------------------------------------
    def create_study(self, **row: Any) -> int:
        row = _checked(_STUDY_WRITE, row)
        with self.tx():
            return self.db["autorl_studies"].insert({"created": time.time(), "status": "running", **row}).last_pk

    def study(self, name: str | None = None, study_id: int | None = None) -> StudyRow:
        """A study by name or id; the latest when neither is given."""
        where, args = ("name = ?", [name]) if name else ("id = ?", [study_id]) if study_id else ("1", [])
        rows = list(self.db["autorl_studies"].rows_where(where, args, order_by="id desc", limit=1))
        if not rows:
            raise NotFoundError(f"no study {name or study_id or ''} in {self.path}: start one with `autorl run`".replace("  ", " "))
        return _decode(rows[0])

    def has_study(self, name: str) -> bool:
        return bool(self.db.execute("SELECT 1 FROM autorl_studies WHERE name = ?", [name]).fetchone())

    def studies(self, limit: int = 5) -> list[StudyRow]:
        """The latest studies, newest first."""
        return [_decode(s) for s in self.db["autorl_studies"].rows_where(order_by="id desc", limit=limit)]

    def optuna_complete_count(self, optuna_study: str) -> int | None:
        """COMPLETE trials of an Optuna study in this file, read without letting Optuna create its tables."""
        if not self.db.execute("SELECT 1 FROM sqlite_master WHERE name = 'studies'").fetchone():
            return None
        row = self.db.execute("SELECT study_id FROM studies WHERE study_name = ?", [optuna_study]).fetchone()
        if row is None:
            return None
        q = "SELECT count(*) FROM trials WHERE study_id = ? AND state = 'COMPLETE'"
        return self.db.execute(q, [row[0]]).fetchone()[0]

    def update_study(self, study_id: int, **values: Any) -> None:
        values = _checked(_STUDY_WRITE, values)
        with self.tx():
            self.db["autorl_studies"].update(study_id, values)

    # ---- trials -------------------------------------------------------------
    def add_trial(self, **row: Any) -> int:
        row = _checked(_TRIAL_WRITE, row)
        with self.tx():
            tid = self.db["autorl_trials"].insert({"status": "running", "kind": "trial", **row}).last_pk
            _insert_event(self.db, row.get("study_id"), tid, "trial-start", row.get("attempt", ""))
        return tid

    def update_trial(self, trial_id: int, event: str | None = None, **values: Any) -> None:
        values = _checked(_TRIAL_WRITE, values)
        with self.tx():
            self.db["autorl_trials"].update(trial_id, values)
            if event:
                row = self.db["autorl_trials"].get(trial_id)
                _insert_event(self.db, row["study_id"], trial_id, event, values.get("reason") or values.get("status") or "")

    def trial(self, number: int) -> TrialRow:
        rows = list(self.db["autorl_trials"].rows_where("number = ?", [number]))
        if not rows:
            raise NotFoundError(f"no trial {number:02d} in the ledger: list them with `autorl ledger`")
        return _decode(rows[0])

    def trials(self, study_id: int | None = None, **equal: Any) -> list[TrialRow]:
        """Trials in attempt order, optionally of one study and with columns equal to values (e.g. kind="full")."""
        unknown = set(equal) - set(TRIAL_COLUMNS)
        if unknown:
            raise ValueError(f"no trial column {sorted(unknown)}")
        return _select(self.db, " AND ".join([f"{k} = ?" for k in equal] or ["1"]), list(equal.values()), study_id)

    # named queries: every condition on trials beyond plain equality lives here (one study's in StudyRecords)
    def baselines(self, study_id: int) -> list[TrialRow]:
        """The study's baseline runs (the recipe as written, every seed). A baseline that crashed and was
        retried (triage's retry of a hang, timeout, network error or OOM) is replaced by its retry."""
        where = ("kind = 'trial' AND (proposer = 'baseline' OR (proposer = 'retry' AND retry_of IN "
                 "(SELECT number FROM autorl_trials WHERE proposer = 'baseline'))) "
                 "AND number NOT IN (SELECT retry_of FROM autorl_trials WHERE retry_of IS NOT NULL)")
        return _select(self.db, where, [], study_id)

    def crashed(self, study_id: int | None = None) -> list[TrialRow]:
        """Trials that crashed (verdict or status crash)."""
        return _select(self.db, "verdict = 'crash' OR status = 'crash'", [], study_id)

    def hypothesis_counts(self) -> dict[str, dict[str, int]]:
        """Per hypothesis id: finished trials that tested it (confirmation runs apart), how many of them a move
        rule proposed, and their candidates, confirmed and rejected improvements."""
        q = ("SELECT hypothesis, count(*), sum(proposer = 'move'), sum(verdict = 'improved'), "
             "sum(confirmation = 'confirmed'), sum(confirmation = 'rejected') FROM autorl_trials "
             "WHERE hypothesis IS NOT NULL AND confirms IS NULL AND kind = 'trial' AND status != 'running' "
             "GROUP BY hypothesis")
        keys = ("tried", "moves", "candidates", "confirmed", "rejected")
        return {r[0]: dict(zip(keys, (int(v or 0) for v in r[1:]))) for r in self.db.execute(q).fetchall()}

    def unfinished(self) -> list[TrialRow]:
        """Trials still marked running, and full runs that have not been closed."""
        return _select(self.db, "status = 'running' OR (kind = 'full' AND end_tag IS NULL)", [], None)

    def set_confirmation(self, number: int, state: str, reason: str, **stats: Any) -> None:
        """Mark trial ``number`` candidate, confirmed, rejected or suspect, with why (and the confirmation's
        ``confirm_*`` columns: its test, the noise it assumed, its error rate; the hack gate's ``gate`` columns)."""
        row = self.trial(number)
        self.update_trial(row["id"], event=f"confirmation-{state}", confirmation=state,
                          reason=f"{row.get('reason') or ''} | {state}: {reason}".lstrip(" |"), **stats)

    def max_number(self) -> int:
        row = self.db.execute("SELECT max(number) FROM autorl_trials").fetchone()
        return row[0] or 0

    # ---- metrics and events -------------------------------------------------
    def add_metrics(self, trial_id: int, records: list[dict]) -> None:
        if not records:
            return
        rows = [{"trial_id": trial_id, "step": int(r.get("step", 0) or 0), "type": r.get("type", "step"),
                 "data": json.dumps(r, default=str)} for r in records]
        with self.tx():
            self.db["autorl_metrics"].insert_all(rows)

    def metrics(self, trial_id: int) -> list[dict]:
        cur = self.db.execute("SELECT data FROM autorl_metrics WHERE trial_id = ? ORDER BY rowid", [trial_id])
        return [json.loads(r[0]) for r in cur.fetchall()]

    def event(self, study_id: int | None, trial_id: int | None, kind: str, message: str) -> None:
        with self.tx():
            _insert_event(self.db, study_id, trial_id, kind, message)

    def events(self, study_id: int | None = None, limit: int = 50) -> list[dict]:
        where, args = ("study_id = ?", [study_id]) if study_id else ("1", [])
        return list(self.db["autorl_events"].rows_where(where, args, order_by="id desc", limit=limit))

    def close(self, lost: bool = False) -> None:
        """Close the connection. With ``lost`` (the file was removed or replaced while open), its write-ahead log
        is first folded into the file this ledger opened, wherever that file is now: a ledger put back is whole,
        and no stale log is left at the path to be read into whatever file is there next."""
        try:
            if lost:
                self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            self.db.close()
        except sqlite3.Error:
            pass


class StudyRows:
    """One study's trial rows held in memory and kept current with the file, so a running study's many questions
    per trial cost no SQL and no pass over every row (``StudyRecords``' queries are views over them).

    ``current()`` first asks whether anything was committed since the rows were last read: SQLite's ``PRAGMA
    data_version`` changes when another connection commits (another study, Optuna's own connection, an older
    autorl), and the connection's ``total_changes`` when this one writes. Only then are rows read, and only those
    whose revision (``rev``, kept by the ledger's triggers) is above the highest already read. Each changed row is
    put into the views kept so far (a query's rows in attempt order, an aggregate, an index), one row at a time,
    so a long study's trial costs what a short one's does. Inside an open transaction nothing is cached (what it
    wrote may still roll back): the rows are read afresh."""

    def __init__(self, ledger: "Ledger", study_id: int):
        self.ledger, self.study_id = ledger, study_id
        self.by_id: dict[int, TrialRow] = {}
        self.by_number: dict[int, TrialRow] = {}
        self.all = _Ordered()  # every row, in attempt order
        self.views: dict[Any, Any] = {}  # _Subset, _Derived and _Index views, by query
        self.rev = 0  # the highest revision read
        self.mark: tuple[int, int] | None = None  # (data_version, total_changes) the rows were current at
        self.reads, self.rows_read = 0, 0  # SELECTs of trial rows made, rows they returned (tests count them)

    def current(self) -> bool:
        """Bring the rows up to date; False inside an open transaction (then use ``fresh``)."""
        conn = self.ledger.db.conn
        if conn.in_transaction:
            return False
        mark = (conn.execute("PRAGMA data_version").fetchone()[0], conn.total_changes)
        if mark != self.mark:
            top = conn.execute("SELECT max(rev) FROM autorl_trials").fetchone()[0] or 0
            if top > self.rev:
                self.reads += 1
                rows = self.ledger.db.query("SELECT * FROM autorl_trials WHERE rev > ? AND rev <= ? AND "
                                            "study_id = ?", [self.rev, top, self.study_id])
                self._take([_decode(r) for r in rows])
                self.rev = top
            self.mark = mark
        return True

    def _take(self, rows: list[TrialRow]) -> None:
        self.rows_read += len(rows)
        for row in rows:
            old = self.by_id.get(row["id"])
            self.by_id[row["id"]] = row
            if old is not None and old.get("number") is not None:
                self.by_number.pop(old["number"], None)
            if row.get("number") is not None:
                self.by_number[row["number"]] = row
            self.all.put(old, row)
            for view in self.views.values():
                view.put(old, row)

    def view(self, key: Any, make: Callable[[], Any]) -> Any:
        """The view kept under ``key`` (made and filled from every row the first time it is asked for)."""
        if key not in self.views:
            view = make()
            view.fill(self.all.rows)
            self.views[key] = view
        return self.views[key]

    def fresh(self) -> list[TrialRow]:
        """The study's rows read now, past the cache (inside a transaction)."""
        rows = _select(self.ledger.db, "1", [], self.study_id)
        self.reads, self.rows_read = self.reads + 1, self.rows_read + len(rows)
        return rows


def _attempt_order(row: TrialRow) -> tuple[bool, int, int]:
    return row.get("number") is not None, row.get("number") or 0, row["id"]


class _Ordered:
    """Rows in ``order`` (attempt order by default); ``put(old, new)`` replaces a row's old version with its new
    one (None: none)."""

    def __init__(self, order: Callable[[TrialRow], tuple] | None = None) -> None:
        self.order = order or _attempt_order
        self.keys: list[tuple] = []
        self.rows: list[TrialRow] = []

    def put(self, old: TrialRow | None, new: TrialRow | None) -> None:
        if old is not None:
            at = bisect.bisect_left(self.keys, self.order(old))
            if at < len(self.keys) and self.rows[at]["id"] == old["id"]:
                if new is not None and self.order(new) == self.keys[at]:
                    self.rows[at] = new
                    return
                del self.keys[at], self.rows[at]
        if new is not None:
            key = self.order(new)
            at = len(self.keys) if not self.keys or key > self.keys[-1] else bisect.bisect_left(self.keys, key)
            self.keys.insert(at, key)
            self.rows.insert(at, new)


class _Subset:
    """The rows ``keep`` keeps, in attempt order (or ``order``), kept up to date row by row."""

    def __init__(self, keep: Callable[[TrialRow], bool], order: Callable[[TrialRow], tuple] | None = None):
        self.keep, self.kept = keep, _Ordered(order)

    def fill(self, rows: list[TrialRow]) -> None:
        for row in rows:
            self.put(None, row)

    def put(self, old: TrialRow | None, new: TrialRow) -> None:
        self.kept.put(old if old is not None and self.keep(old) else None, new if self.keep(new) else None)

    def value(self) -> list[TrialRow]:
        return self.kept.rows


class _Derived:
    """A value computed from all the study's rows (``compute``), computed again only after a row that
    ``touches`` it changed; ``fold(value, old, new)`` may bring it up to date at once (``_STALE``: it cannot)."""

    def __init__(self, compute: Callable[[list[TrialRow]], Any], touches: Callable[[TrialRow], bool],
                 fold: Callable[[Any, TrialRow | None, TrialRow], Any] | None = None):
        self.compute, self.touches, self.fold = compute, touches, fold
        self.rows: list[TrialRow] = []
        self.kept: Any = _STALE

    def fill(self, rows: list[TrialRow]) -> None:
        self.rows = rows  # the list _Ordered keeps: computed from as it is when asked

    def put(self, old: TrialRow | None, new: TrialRow) -> None:
        if self.kept is _STALE or not (self.touches(new) or (old is not None and self.touches(old))):
            return
        self.kept = self.fold(self.kept, old, new) if self.fold is not None else _STALE

    def value(self) -> Any:
        if self.kept is _STALE:
            self.kept = self.compute(self.rows)
        return self.kept


_STALE = object()


class _Index:
    """Rows by a hashable summary of their train values (``_params_key``), kept up to date row by row."""

    def __init__(self) -> None:
        self.rows: dict[Any, dict[int, TrialRow]] = {}

    def fill(self, rows: list[TrialRow]) -> None:
        for row in rows:
            self.put(None, row)

    def put(self, old: TrialRow | None, new: TrialRow) -> None:
        if old is not None:
            self.rows.get(_params_key(old.get("params")), {}).pop(old["id"], None)
        self.rows.setdefault(_params_key(new.get("params")), {})[new["id"]] = new

    def value(self, params: dict[str, Any]) -> list[TrialRow]:
        """The rows that may have run ``params`` (to be compared in full), in attempt order."""
        return sorted(self.rows.get(_params_key(params), {}).values(), key=_attempt_order)


def _params_key(params: Any) -> Any:
    """What equal train blocks share (their scalar values; 1 and 1.0 hash alike, as they compare equal)."""
    if not isinstance(params, dict):
        return None
    return frozenset((k, v) for k, v in params.items() if v is None or isinstance(v, (bool, int, float, str)))


def _baselines(rows: list[TrialRow]) -> list[TrialRow]:
    """``Ledger.baselines`` over one study's rows (a retry is always of its own study's trial)."""
    first = {r["number"] for r in rows if r.get("proposer") == "baseline"}
    retried = {r["retry_of"] for r in rows if r.get("retry_of") is not None}
    return [r for r in rows if r.get("kind") == "trial" and r["number"] not in retried and (
        r.get("proposer") == "baseline" or (r.get("proposer") == "retry" and r.get("retry_of") in first))]


def _in_baselines(row: TrialRow) -> bool:
    """A row whose change can change ``_baselines``: a baseline, a retry, or a row that retries another."""
    return row.get("proposer") in ("baseline", "retry") or row.get("retry_of") is not None


def _unretried(rows: list[TrialRow]) -> list[TrialRow]:
    ran = {r["retry_of"] for r in rows if r.get("retry_of") is not None and _ran(r)}
    return [r for r in rows if r.get("kind") == "trial" and r.get("status") == "crash" and r.get("retry_of") is None
            and r.get("confirms") is None and r["number"] not in ran]


def _in_unretried(row: TrialRow) -> bool:
    """A row whose change can change ``_unretried``: a crash, or a retry."""
    return row.get("status") == "crash" or row.get("retry_of") is not None


def _ran(row: TrialRow) -> bool:
    """Not stopped early by the controller (SQL's ``status NOT IN STOPPED_EARLY``: a NULL status is not)."""
    return row.get("status") is not None and row["status"] not in STOPPED_EARLY


def _finished(row: TrialRow) -> bool:
    return row.get("kind") == "trial" and row.get("status") == "complete" and row.get(
        "started") is not None and row.get("finished") is not None


def _end_of(row: TrialRow | None) -> float | None:
    """When a trial (not a full run) that started ended, or None."""
    if row is None or row.get("kind") != "trial" or row.get("started") is None:
        return None
    return row.get("finished")


def _first_end() -> "_Derived":
    """The earliest end of the study's trials that started, kept up to date as trials end."""
    return _Derived(lambda rows: min((v for v in map(_end_of, rows) if v is not None), default=None),
                    lambda r: _end_of(r) is not None, _folding(_end_of, min))


def _folding(of: Callable[[TrialRow | None], Any], pick: Callable[..., Any]) -> Callable[..., Any]:
    """The fold of an aggregate ``pick`` (min, max) over each row's ``of``: a row that gains a value is picked in
    at once; one whose value changed or went makes it stale."""

    def fold(kept: Any, old: TrialRow | None, new: TrialRow) -> Any:
        before, after = of(old), of(new)
        if before == after:
            return kept
        if before is None:
            return after if kept is None else pick(kept, after)
        return _STALE

    return fold


def _objective_of(row: TrialRow | None) -> float | None:
    """A trial's (not a full run's) objective, or None."""
    return row.get("objective") if row is not None and row.get("kind") == "trial" else None


def _best(maximize: bool) -> _Derived:
    """The best objective of the study's trials, kept up to date as trials end."""
    pick = max if maximize else min
    return _Derived(lambda rows: pick((v for v in map(_objective_of, rows) if v is not None), default=None),
                    lambda r: _objective_of(r) is not None, _folding(_objective_of, pick))


class StudyRecords:
    """One study's rows, and the queries a running study asks of them (the study loop, its proposer, the evidence
    a verdict rests on), answered from ``StudyRows`` (a row changed by any process is seen at the next query).
    Each returns copies: a caller may change what it got. Its writes go through the ledger, one transaction
    each."""

    def __init__(self, ledger: Ledger, study_id: int):
        self.ledger, self.id = ledger, study_id
        self.rows = StudyRows(ledger, study_id)

    def _where(self, key: Any, keep: Callable[[TrialRow], bool]) -> list[TrialRow]:
        """Copies of the study's rows that ``keep`` keeps, in attempt order."""
        return [dict(r) for r in self._asked(key, lambda: _Subset(keep))]

    def _asked(self, key: Any, make: Callable[[], Any], *args: Any) -> Any:
        """The value of the view kept under ``key`` (``make`` makes it), or of one made from the rows read afresh
        inside a transaction. Not to be changed by the caller."""
        if not self.rows.current():
            view = make()
            view.fill(self.rows.fresh())
            return view.value(*args)
        return self.rows.view(key, make).value(*args)

    def trials(self, **equal: Any) -> list[TrialRow]:
        """The study's trials in attempt order, with columns equal to values (as SQL's ``=``: None equals
        nothing)."""
        unknown = set(equal) - set(TRIAL_COLUMNS)
        if unknown:
            raise ValueError(f"no trial column {sorted(unknown)}")
        key = ("trials", *sorted((k, repr(v)) for k, v in equal.items()))
        return self._where(key, lambda r: all(v is not None and r.get(k) == v for k, v in equal.items()))

    def trial(self, number: int) -> TrialRow:
        """Trial ``number`` (another study's too: read from the file)."""
        if self.rows.current() and number in self.rows.by_number:
            return dict(self.rows.by_number[number])
        return self.ledger.trial(number)

    def metrics(self, trial_id: int) -> list[dict]:
        return self.ledger.metrics(trial_id)

    def event(self, trial_id: int | None, kind: str, message: str) -> None:
        self.ledger.event(self.id, trial_id, kind, message)

    def baselines(self) -> list[TrialRow]:
        """The study's baseline runs (``Ledger.baselines``: a crashed baseline's retry stands in for it)."""
        return [dict(r) for r in self._asked("baselines", lambda: _Derived(_baselines, _in_baselines))]

    def scored(self) -> list[TrialRow]:
        """The study's trials (not full runs) that have an objective value."""
        return self._where("scored", lambda r: _objective_of(r) is not None)

    def best_objective(self, maximize: bool) -> float | None:
        """The best objective of the study's trials (not full runs), None before any has one."""
        return self._asked(("best", maximize), lambda: _best(maximize))

    def finished(self, last: int) -> list[TrialRow]:
        """The ``last`` completed trials (not full runs) with their start and end times, in start order."""
        done = self._asked("finished", lambda: _Subset(_finished, lambda r: (r["started"], *_attempt_order(r))))
        return [dict(r) for r in done[-last:]]

    def first_end(self) -> float | None:
        """When the study's first trial (not a full run) that started ended (None before one has)."""
        return self._asked("first_end", _first_end)

    def ran(self, params: dict[str, Any], hypothesis: str | None = None, *, same_hypothesis: bool = False
            ) -> TrialRow | None:
        """The first trial (not a full run) whose train block was exactly ``params`` (with ``same_hypothesis``,
        under ``hypothesis`` too), or None."""
        rows = self._asked("params", _Index, params)
        for r in rows:
            if r.get("kind") == "trial" and r.get("params") == params and (
                    not same_hypothesis or r.get("hypothesis") == hypothesis):
                return dict(r)
        return None

    def crash_signatures(self) -> list[TrialRow]:
        """Crashed trials that have a triage signature."""
        return self._where("signatures", lambda r: r.get("verdict") == "crash" and r.get("crash_signature") is not None)

    def confirmed(self) -> list[TrialRow]:
        """The study's trials whose improvement fresh-seed re-runs confirmed."""
        return self.trials(confirmation="confirmed", kind="trial")

    def open_candidates(self) -> list[TrialRow]:
        """Improved trials whose fresh-seed confirmation has not decided yet (neither confirmed nor rejected)."""
        return self.trials(confirmation="candidate", kind="trial")

    def confirm_runs(self, candidate: int, ran: bool = False) -> list[TrialRow]:
        """The confirmation runs of candidate ``candidate`` (an attempt number); with ``ran``, only those the
        controller did not stop early (see ``STOPPED_EARLY``)."""
        return self._where(("confirm_runs", candidate, ran), lambda r: r.get("confirms") == candidate
                           and r.get("kind") == "trial" and (_ran(r) or not ran))

    def confirm_groups(self) -> dict[int, list[TrialRow]]:
        """Completed confirmation runs by candidate number (replicate groups for the run-noise estimate)."""
        out: dict[int, list[TrialRow]] = {}
        for row in self._where("confirm_groups", lambda r: r.get("confirms") is not None and r.get(
                "status") == "complete" and r.get("kind") == "trial"):
            out.setdefault(row["confirms"], []).append(row)
        return out

    def unretried_crashes(self) -> list[TrialRow]:
        """Crashed first runs (not a retry, not a confirmation run) with no retry that ran: no retry row, or
        only retries the controller stopped early. Whether triage wanted a retry is in ``crash_action``."""
        return [dict(r) for r in self._asked("unretried", lambda: _Derived(_unretried, _in_unretried))]

    def set_base_changes(self, changes: dict[str, Any], line: str) -> None:
        """Record the train values the study's base recipe now carries (and why, as a ``base-recipe`` event)."""
        with self.ledger.tx():
            self.ledger.db["autorl_studies"].update(self.id, _checked(_STUDY_WRITE, {"base_changes": changes}))
            _insert_event(self.ledger.db, self.id, None, "base-recipe", line)


def _migrate(db: sqlite_utils.Database, tx: Callable[[], Any]) -> None:
    """The migrations the ledger lacks, each one transaction with its own record. The record table is made in
    the first one's transaction, so a reader never sees it without the tables it stands for."""
    pending = set(_pending(db))
    for name, step in MIGRATIONS:
        if name not in pending:
            continue
        with tx():
            db.execute("CREATE TABLE IF NOT EXISTS autorl_migrations (name TEXT PRIMARY KEY, applied REAL)")
            step(db)
            db.execute("INSERT INTO autorl_migrations VALUES (?, ?)", [name, time.time()])


def open_read(path: str | Path) -> Ledger:
    """The ledger at ``path`` for reading only (the review commands): nothing is created or written, except the
    migrations a ledger of an older autorl still needs."""
    path = Path(path)
    if not path.is_file():
        raise NotFoundError(f"no ledger at {short(path, 200)}: run a study first with `autorl run`")
    ledger = Ledger(path, readonly=True)
    with _translated_errors(path):
        pending = _pending(ledger.db)
        made = ledger.db.execute("SELECT 1 FROM sqlite_master WHERE name = 'autorl_migrations'").fetchone()
    if not made:  # an empty file, or an empty database: a review command does not make it a ledger
        ledger.close()
        raise NotFoundError(f"{short(path, 200)} holds no autorl ledger (no tables): run a study first with "
                            "`autorl run`, or pass your ledger with --ledger FILE")
    if pending:
        ledger.close()
        Ledger(path).close()
        ledger = Ledger(path, readonly=True)
    return ledger


def _pending(db: sqlite_utils.Database) -> list[str]:
    """The migrations the ledger has not had yet."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'autorl_migrations'").fetchone():
        return [name for name, _ in MIGRATIONS]
    done = {r[0] for r in db.execute("SELECT name FROM autorl_migrations").fetchall()}
    return [name for name, _ in MIGRATIONS if name not in done]


def _select(db: sqlite_utils.Database, where: str, args: list, study_id: int | None) -> list[TrialRow]:
    if study_id is not None:
        where, args = f"({where}) AND study_id = ?", args + [study_id]
    return [_decode(r) for r in db["autorl_trials"].rows_where(where, args, order_by="number")]


def _insert_event(db: sqlite_utils.Database, study_id: int | None, trial_id: int | None, kind: str,
                  message: str) -> None:
    db["autorl_events"].insert({"time": time.time(), "study_id": study_id, "trial_id": trial_id,
                                "kind": kind, "message": message})


def _checked(model: type[BaseModel], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` validated against the row's columns (an unknown column or a wrong type is a bug: ValueError),
    JSON columns serialised."""
    try:
        typed = model.model_validate(values)
    except ValidationError as exc:
        raise ValueError(f"ledger write: {validation_line(exc)}") from None
    return {k: _jsonify(getattr(typed, k)) for k in values}


def _open(path: Path) -> sqlite_utils.Database:
    _check_path(path)
    conn = sqlite3.connect(str(path), timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=30000")
    return sqlite_utils.Database(conn)


def _check_path(path: Path) -> None:
    if path.exists() and not path.is_file():
        raise WorkspaceError(f"ledger path {short(path, 200)} is not a file: pass --ledger FILE")
    if path.is_symlink() and not path.exists():
        raise WorkspaceError(f"ledger path {short(path, 200)} is a link to nothing: point it at your ledger, or pass "
                             "--ledger FILE")
    if not path.parent.is_dir():
        raise WorkspaceError(f"ledger directory {short(path.parent, 200)} does not exist: create it or pass another "
                             "--ledger")


def _open_read(path: Path) -> sqlite_utils.Database:
    """A read-only connection. Where SQLite cannot make the shared-memory file a WAL reader needs (a full disk,
    a read-only folder) and no write-ahead log is waiting, the file is read as it is on disk (``immutable``)."""
    _check_path(path)
    with _translated_errors(path):
        for extra in ("", "&immutable=1"):
            conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro{extra}", uri=True, timeout=30,
                                   isolation_level=None, check_same_thread=False)
            try:
                conn.execute("PRAGMA busy_timeout=30000")
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.OperationalError as exc:
                conn.close()
                if extra or _has_wal(path) or _code(exc) not in _CANNOT_READ_IN_PLACE:
                    raise
                continue
            _check_is_ledger(conn, path)
            return sqlite_utils.Database(conn)
    raise AssertionError("unreachable")


_CANNOT_READ_IN_PLACE = ("SQLITE_CANTOPEN", "SQLITE_IOERR", "SQLITE_FULL", "SQLITE_READONLY", "SQLITE_IOERR_SHMSIZE",
                         "SQLITE_IOERR_SHMOPEN", "SQLITE_READONLY_CANTINIT", "SQLITE_IOERR_WRITE",
                         "SQLITE_IOERR_TRUNCATE", "SQLITE_IOERR_SHMMAP")


def _has_wal(path: Path) -> bool:
    try:
        return os.path.getsize(f"{path}-wal") > 0
    except OSError:
        return False


def _check_is_ledger(conn: sqlite3.Connection, path: Path) -> None:
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}
    if names and not names & {"autorl_trials", "autorl_migrations"}:  # migrations alone: a ledger still being made
        conn.close()
        raise LedgerError(f"{short(path, 200)} is a SQLite file but not an autorl ledger (no autorl_trials table): "
                          "pass your ledger with --ledger FILE")


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``, or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


# ---- any SQLite failure is one line ------------------------------------------------------------------------------
def _code(exc: BaseException) -> str:
    """SQLite's error name (Python >= 3.11 gives it), else one read from the message."""
    name = getattr(exc, "sqlite_errorname", None)
    if name:
        return name
    text = str(exc).lower()
    for needle, code in (("disk is full", "SQLITE_FULL"), ("malformed", "SQLITE_CORRUPT"),
                         ("not a database", "SQLITE_NOTADB"), ("readonly", "SQLITE_READONLY"),
                         ("locked", "SQLITE_BUSY"), ("disk i/o", "SQLITE_IOERR"), ("unable to open", "SQLITE_CANTOPEN")):
        if needle in text:
            return code
    return "SQLITE_ERROR"


def ledger_error(path: Path, exc: BaseException) -> Exception:
    """The one line that says what a SQLite failure on the ledger at ``path`` means, and what to do."""
    code, msg, where = _code(exc), short(exc, 120), short(path, 200)
    if code == "SQLITE_FULL" or (code.startswith("SQLITE_IOERR") and free_bytes(path) < (1 << 20)):
        return disk_full(path)
    if code.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return damaged(path, msg)
    if code == "SQLITE_READONLY_DBMOVED":
        return LedgerError(f"ledger {where} was moved or removed while in use ({msg}): put it back, then `autorl run "
                           "--resume`")
    if code.startswith("SQLITE_READONLY"):
        return LedgerError(f"ledger {where} cannot be written ({msg}): check the permissions of the file and its "
                           "folder, or pass another --ledger")
    if code.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return LedgerError(f"ledger {where} stayed locked by another process for 30 s ({msg}): try again once it "
                           "is done")
    if code.startswith("SQLITE_CANTOPEN"):
        return LedgerError(f"ledger {where} cannot be opened ({msg}): check that its folder exists and is "
                           "writable, or pass another --ledger")
    return LedgerError(f"ledger {where}: SQLite failed ({code}: {msg}): the ledger is kept as it is; check the "
                       "disk, then try again")


def damaged(path: Path, what: str) -> LedgerError:
    where = short(path, 200)
    return LedgerError(f"ledger {where} is damaged ({what}): keep the file; rebuild what it holds into a new one "
                       "with `sqlite3 LEDGER .recover | sqlite3 recovered.sqlite` and pass that with --ledger "
                       "(or --ledger NEW.sqlite to start afresh)")


def disk_full(path: Path) -> DiskFullError:
    free = free_bytes(path)
    return DiskFullError(f"no space left on the disk of {short(path, 200)} ({_size(free)} free): free some space, then "
                         "run the command again (a stopped study goes on with `autorl run --resume`; its ledger is "
                         "kept)")


def free_bytes(path: Path) -> int:
    """Bytes free to this user on the file system of ``path`` (or of the nearest folder above it that exists)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return 1 << 62


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


@contextmanager
def _translated_errors(path: Path) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise ledger_error(path, exc) from None
    except OSError as exc:
        if exc.errno == 28:  # ENOSPC
            raise disk_full(path) from None
        raise


def _translating(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        with _translated_errors(self.path if isinstance(self, Ledger) else self.ledger.path):
            return fn(self, *args, **kwargs)

    return wrapper


def _translate_all(cls: type) -> None:
    """Every public method of ``cls`` turns a SQLite failure into its one line."""
    for name, fn in list(vars(cls).items()):
        if callable(fn) and not name.startswith("_") and name != "tx":
            setattr(cls, name, _translating(fn))


_translate_all(Ledger)
_translate_all(StudyRecords)


def _jsonify(v: Any) -> Any:
    return json.dumps(v, sort_keys=True, default=str) if isinstance(v, (dict, list)) else v


def _decode(row: dict) -> Any:
    out = dict(row)
    for key in _JSON_COLUMNS:
        if isinstance(out.get(key), str):
            try:
                out[key] = json.loads(out[key])
            except json.JSONDecodeError:
                pass
    return out


def ledger_guard(path: Path) -> None:
    """Fail early, before anything is written, if the ledger cannot be written or read: a path that is not a file,
    a folder that is not there or not writable, a disk with no room, a file that is not an autorl ledger, a
    damaged one (every page is checked)."""
    _check_path(path)
    target = path if path.exists() else path.parent
    if not os.access(target, os.W_OK):
        raise WorkspaceError(f"ledger {short(path, 200)} is not writable: fix its permissions or pass another --ledger")
    if free_bytes(target) < MIN_FREE:
        raise disk_full(path)
    if path.exists():
        ledger = Ledger(path, readonly=True)
        try:
            ledger.file.verify(ledger.db)
        finally:
            ledger.close()


MIN_FREE = 4 << 20  # a study does not start with less free space than this where its ledger lives
