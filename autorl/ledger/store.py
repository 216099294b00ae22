"""The ledger: every statement a study, a trial, its metrics and events are written and read with (``Ledger``),
one study's face (``StudyRecords``), and the two ways into a file (``open_read`` for the review commands,
``ledger_guard`` before a study writes anything)."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from autorl.errors import NotFoundError, WorkspaceError, short
from autorl.ledger.errors import disk_full, free_bytes, translate_all, translated_errors
from autorl.ledger.files import LedgerFile, check_path, open_readonly, open_write
from autorl.ledger.migrations import migrate, pending_migrations
from autorl.ledger.rows import (
    STUDY_WRITE,
    TRIAL_COLUMNS,
    TRIAL_WRITE,
    Event,
    Study,
    Trial,
    checked,
    decode,
    insert_event,
    select,
)
from autorl.ledger.views import (
    Derived,
    Index,
    StudyRows,
    Subset,
    attempt_order,
    baselines_of,
    best_view,
    finished_row,
    first_end_view,
    in_baselines,
    in_unretried,
    objective_of,
    ran_to_end,
    unretried,
)
from autorl.states import Confirmation, CrashCategory, Kind, StudyStatus, TrialStatus, Verdict


class Ledger:
    """The ledger of one workspace. Every write is one transaction; ``records(study_id)`` is one study's face;
    ``file`` is the file it opened."""

    def __init__(self, path: str | Path, readonly: bool = False):
        self.path = Path(path)
        self.file = LedgerFile(self.path, readonly)
        self.damage: str | None = None  # what open_read's check found wrong (a review command says it is partial)
        if readonly:
            self.db = open_readonly(self.path)
            self.file.remember()
            return
        check_path(self.path)
        with self.file.exclusive("create or migrate the ledger"), translated_errors(self.path):
            self.db = open_write(self.path)
            self.file.remember()
            migrate(self.db, self.tx)

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

    def records(self, study_id: int) -> StudyRecords:
        """The rows of study ``study_id``, and the queries a running study asks of them."""
        return StudyRecords(self, study_id)

    # ---- studies ----------------------------------------------------------
    def create_study(self, **row: Any) -> int:
        row = checked(STUDY_WRITE, row)
        with self.tx():
            made = {"created": time.time(), "status": StudyStatus.RUNNING, **row}
            return _row_id(self.db.table("autorl_studies").insert(made).last_pk)

    def study(self, name: str | None = None, study_id: int | None = None) -> Study:
        """A study by name or id; the latest when neither is given."""
        where, args = ("name = ?", [name]) if name else ("id = ?", [study_id]) if study_id else ("1", [])
        rows = list(self.db.table("autorl_studies").rows_where(where, args, order_by="id desc", limit=1))
        if not rows:
            raise NotFoundError(
                f"no study {name or study_id or ''} in {self.path}: start one with `autorl run`".replace("  ", " ")
            )
        return Study.read(rows[0])

    def has_study(self, name: str) -> bool:
        return bool(self.db.execute("SELECT 1 FROM autorl_studies WHERE name = ?", [name]).fetchone())

    def studies(self, limit: int = 5) -> list[Study]:
        """The latest studies, newest first."""
        return [Study.read(s) for s in self.db.table("autorl_studies").rows_where(order_by="id desc", limit=limit)]

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
        values = checked(STUDY_WRITE, values)
        with self.tx():
            self.db.table("autorl_studies").update(study_id, values)

    # ---- trials -------------------------------------------------------------
    def add_trial(self, **row: Any) -> int:
        row = checked(TRIAL_WRITE, row)
        with self.tx():
            made = {"status": TrialStatus.RUNNING, "kind": Kind.TRIAL, **row}
            tid = _row_id(self.db.table("autorl_trials").insert(made).last_pk)
            insert_event(self.db, row.get("study_id"), tid, "trial-start", row.get("attempt", ""))
        return tid

    def update_trial(
        self, trial_id: int, event: str | None = None, more_events: Sequence[tuple[str, str]] = (), **values: Any
    ) -> None:
        """Set ``values`` on the trial's row, with its ``event`` and any ``more_events`` (kind, message), in one
        transaction."""
        values = checked(TRIAL_WRITE, values)
        with self.tx():
            self.db.table("autorl_trials").update(trial_id, values)
            if event or more_events:
                study_id = self.db.table("autorl_trials").get(trial_id)["study_id"]
            if event:
                insert_event(self.db, study_id, trial_id, event, values.get("reason") or values.get("status") or "")
            for kind, message in more_events:
                insert_event(self.db, study_id, trial_id, kind, message)

    def trial(self, number: int) -> Trial:
        rows = list(self.db.table("autorl_trials").rows_where("number = ?", [number]))
        if not rows:
            raise NotFoundError(f"no trial {number:02d} in the ledger: list them with `autorl ledger`")
        return decode(rows[0])

    def trials(self, study_id: int | None = None, **equal: Any) -> list[Trial]:
        """Trials in attempt order, optionally of one study and with columns equal to values (e.g. kind="full")."""
        unknown = set(equal) - set(TRIAL_COLUMNS)
        if unknown:
            raise ValueError(f"no trial column {sorted(unknown)}")
        return select(self.db, " AND ".join([f"{k} = ?" for k in equal] or ["1"]), list(equal.values()), study_id)

    # named queries: every condition on trials beyond plain equality lives here (one study's in StudyRecords)
    def baselines(self, study_id: int) -> list[Trial]:
        """The study's baseline runs (the recipe as written, every seed). A baseline that crashed and was
        retried (triage's retry of a hang, timeout, network error or OOM) is replaced by its retry."""
        where = (
            "kind = 'trial' AND (proposer = 'baseline' OR (proposer = 'retry' AND retry_of IN "
            "(SELECT number FROM autorl_trials WHERE proposer = 'baseline'))) "
            "AND number NOT IN (SELECT retry_of FROM autorl_trials WHERE retry_of IS NOT NULL)"
        )
        return select(self.db, where, [], study_id)

    def crashed(self, study_id: int | None = None) -> list[Trial]:
        """Trials that crashed (verdict or status crash)."""
        return select(self.db, "verdict = 'crash' OR status = 'crash'", [], study_id)

    def hypothesis_counts(self) -> dict[str, dict[str, int]]:
        """Per hypothesis id: finished trials that tested it (confirmation runs apart), how many of them a move
        rule proposed, and their candidates, confirmed and rejected improvements."""
        q = (
            "SELECT hypothesis, count(*), sum(proposer = 'move'), sum(verdict = 'improved'), "
            "sum(confirmation = 'confirmed'), sum(confirmation = 'rejected') FROM autorl_trials "
            "WHERE hypothesis IS NOT NULL AND confirms IS NULL AND kind = 'trial' AND status != 'running' "
            "GROUP BY hypothesis"
        )
        keys = ("tried", "moves", "candidates", "confirmed", "rejected")
        return {r[0]: dict(zip(keys, (int(v or 0) for v in r[1:]))) for r in self.db.execute(q).fetchall()}

    def unfinished(self) -> list[Trial]:
        """Trials still marked running, and full runs that have not been closed (but one marked interrupted: its
        machine went, ``autorl promote --resume`` started it over)."""
        where = "status = 'running' OR (kind = 'full' AND end_tag IS NULL AND status != 'interrupted')"
        return select(self.db, where, [], None)

    def set_confirmation(self, number: int, state: str, reason: str, **stats: Any) -> None:
        """Mark trial ``number`` candidate, confirmed, rejected or suspect, with why (and the confirmation's
        ``confirm_*`` columns: its test, the noise it assumed, its error rate; the hack gate's ``gate`` columns)."""
        row = self.trial(number)
        self.update_trial(
            row.id,
            event=f"confirmation-{state}",
            confirmation=state,
            reason=f"{row.reason or ''} | {state}: {reason}".lstrip(" |"),
            **stats,
        )

    def crash_labels(self) -> CrashLabels:
        """The crash labels a person gave (``autorl triage label``): recorded and read through it."""
        return CrashLabels(self)

    def max_number(self) -> int:
        row = self.db.execute("SELECT max(number) FROM autorl_trials").fetchone()
        return row[0] or 0

    # ---- metrics and events -------------------------------------------------
    def add_metrics(self, trial_id: int, records: list[dict]) -> None:
        if not records:
            return
        rows = [
            {
                "trial_id": trial_id,
                "step": int(r.get("step", 0) or 0),
                "type": r.get("type", "step"),
                "data": json.dumps(r, default=str),
            }
            for r in records
        ]
        with self.tx():
            self.db.table("autorl_metrics").insert_all(rows)

    def metrics(self, trial_id: int) -> list[dict]:
        cur = self.db.execute("SELECT data FROM autorl_metrics WHERE trial_id = ? ORDER BY rowid", [trial_id])
        return [json.loads(r[0]) for r in cur.fetchall()]

    def event(self, study_id: int | None, trial_id: int | None, kind: str, message: str) -> None:
        with self.tx():
            insert_event(self.db, study_id, trial_id, kind, message)

    def events(self, study_id: int | None = None, limit: int = 50) -> list[Event]:
        """The latest events, newest first."""
        where, args = ("study_id = ?", [study_id]) if study_id else ("1", [])
        return [
            Event.read(e)
            for e in self.db.table("autorl_events").rows_where(where, args, order_by="id desc", limit=limit)
        ]

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


class StudyRecords:
    """One study's rows, and the queries a running study asks of them (the study loop, its proposer, the evidence
    a verdict rests on), answered from ``StudyRows`` (a row changed by any process is seen at the next query).
    Rows are immutable: ``Trial.replace`` makes a changed copy. Its writes go through the ledger, one transaction
    each."""

    def __init__(self, ledger: Ledger, study_id: int):
        self.ledger, self.id = ledger, study_id
        self.rows = StudyRows(ledger.db, study_id)

    def _where(self, key: Any, keep: Callable[[Trial], bool]) -> list[Trial]:
        """Copies of the study's rows that ``keep`` keeps, in attempt order."""
        return list(self._asked(key, lambda: Subset(keep)))

    def _asked(self, key: Any, make: Callable[[], Any], *args: Any) -> Any:
        """The value of the view kept under ``key`` (``make`` makes it), or of one made from the rows read afresh
        inside a transaction. Not to be changed by the caller."""
        if not self.rows.current():
            view = make()
            view.fill(self.rows.fresh())
            return view.value(*args)
        return self.rows.view(key, make).value(*args)

    def trials(self, **equal: Any) -> list[Trial]:
        """The study's trials in attempt order, with columns equal to values (as SQL's ``=``: None equals
        nothing)."""
        unknown = set(equal) - set(TRIAL_COLUMNS)
        if unknown:
            raise ValueError(f"no trial column {sorted(unknown)}")
        key = ("trials", *sorted((k, repr(v)) for k, v in equal.items()))
        return self._where(key, lambda r: all(v is not None and getattr(r, k) == v for k, v in equal.items()))

    def trial(self, number: int) -> Trial:
        """Trial ``number`` (another study's too: read from the file)."""
        if self.rows.current() and number in self.rows.by_number:
            return self.rows.by_number[number]
        return self.ledger.trial(number)

    def metrics(self, trial_id: int) -> list[dict]:
        return self.ledger.metrics(trial_id)

    def event(self, trial_id: int | None, kind: str, message: str) -> None:
        self.ledger.event(self.id, trial_id, kind, message)

    def baselines(self) -> list[Trial]:
        """The study's baseline runs (``Ledger.baselines``: a crashed baseline's retry stands in for it)."""
        return list(self._asked("baselines", lambda: Derived(baselines_of, in_baselines)))

    def scored(self) -> list[Trial]:
        """The study's trials (not full runs) that have an objective value."""
        return self._where("scored", lambda r: objective_of(r) is not None)

    def best_objective(self, maximize: bool) -> float | None:
        """The best objective of the study's trials (not full runs), None before any has one."""
        return self._asked(("best", maximize), lambda: best_view(maximize))

    def finished(self, last: int) -> list[Trial]:
        """The ``last`` completed trials (not full runs) with their start and end times, in start order."""
        done = self._asked("finished", lambda: Subset(finished_row, lambda r: (r.started, *attempt_order(r))))
        return done[-last:]

    def first_end(self) -> float | None:
        """When the study's first trial (not a full run) that started ended (None before one has)."""
        return self._asked("first_end", first_end_view)

    def ran(
        self, params: dict[str, Any], hypothesis: str | None = None, *, same_hypothesis: bool = False
    ) -> Trial | None:
        """The first trial (not a full run) whose train block was exactly ``params`` (with ``same_hypothesis``,
        under ``hypothesis`` too), or None."""
        rows = self._asked("params", Index, params)
        for r in rows:
            if r.kind == Kind.TRIAL and r.params == params and (not same_hypothesis or r.hypothesis == hypothesis):
                return r
        return None

    def crash_signatures(self) -> list[Trial]:
        """Crashed trials that have a triage signature."""
        return self._where("signatures", lambda r: r.verdict == Verdict.CRASH and r.crash_signature is not None)

    def confirmed(self) -> list[Trial]:
        """The study's trials whose improvement fresh-seed re-runs confirmed."""
        return self.trials(confirmation=Confirmation.CONFIRMED, kind=Kind.TRIAL)

    def open_candidates(self) -> list[Trial]:
        """Improved trials whose fresh-seed confirmation has not decided yet (neither confirmed nor rejected)."""
        return self.trials(confirmation=Confirmation.CANDIDATE, kind=Kind.TRIAL)

    def confirm_runs(self, candidate: int, ran: bool = False) -> list[Trial]:
        """The confirmation runs of candidate ``candidate`` (an attempt number); with ``ran``, only those the
        controller did not stop early (see ``STOPPED_EARLY``)."""
        return self._where(
            ("confirm_runs", candidate, ran),
            lambda r: r.confirms == candidate and r.kind == Kind.TRIAL and (ran_to_end(r) or not ran),
        )

    def confirm_groups(self) -> dict[int, list[Trial]]:
        """Completed confirmation runs by candidate number (replicate groups for the run-noise estimate)."""
        out: dict[int, list[Trial]] = {}
        for row in self._where(
            "confirm_groups",
            lambda r: r.confirms is not None and r.status == TrialStatus.COMPLETE and r.kind == Kind.TRIAL,
        ):
            if row.confirms is not None:
                out.setdefault(row.confirms, []).append(row)
        return out

    def unretried_crashes(self) -> list[Trial]:
        """Crashed first runs (not a retry, not a confirmation run) with no retry that ran: no retry row, or
        only retries the controller stopped early. Whether triage wanted a retry is in ``crash_action``."""
        return list(self._asked("unretried", lambda: Derived(unretried, in_unretried)))

    def set_base_changes(self, changes: dict[str, Any], line: str) -> None:
        """Record the train values the study's base recipe now carries (and why, as a ``base-recipe`` event)."""
        with self.ledger.tx():
            self.ledger.db.table("autorl_studies").update(self.id, checked(STUDY_WRITE, {"base_changes": changes}))
            insert_event(self.ledger.db, self.id, None, "base-recipe", line)


class CrashLabels:
    """The ledger's crash labels: a person's corrections of triage's calls, written and read here."""

    def __init__(self, ledger: Ledger):
        self.ledger, self.db = ledger, ledger.db

    def add(self, number: int, category: CrashCategory, root_cause_line: str, family_id: str) -> CrashLabel:
        """Record a correction of triage's call on crashed trial ``number`` in one transaction with its event; the
        trial's own columns keep what triage said (they are history)."""
        with self.ledger.tx():
            trial = self.ledger.trial(number)
            row = {
                "trial_id": trial.id,
                "number": number,
                "category": str(category),
                "root_cause_line": root_cause_line,
                "was_category": None if trial.crash_category is None else str(trial.crash_category),
                "was_root_cause": trial.root_cause,
                "family_id": family_id,
                "created": time.time(),
            }
            label_id = _row_id(self.db.table("autorl_crash_labels").insert(row).last_pk)
            insert_event(self.db, trial.study_id, trial.id, "crash-label", f"{category}: {short(root_cause_line, 160)}")
        return CrashLabel.read({**row, "id": label_id})

    def all(self) -> list[CrashLabel]:
        """Every crash label, oldest first; a trial labelled twice has both (the later one holds)."""
        cur = self.db.execute("SELECT * FROM autorl_crash_labels ORDER BY id")
        names = [c[0] for c in cur.description]
        return [CrashLabel.read(dict(zip(names, r, strict=True))) for r in cur.fetchall()]

    def latest(self) -> dict[int, CrashLabel]:
        """The label that holds for each labelled trial number (the latest given)."""
        return {label.number: label for label in self.all()}


@dataclass(frozen=True, slots=True)
class CrashLabel:
    """One row of ``autorl_crash_labels``: a person's category and root-cause line for a crashed trial."""

    id: int
    trial_id: int
    number: int
    category: CrashCategory | str  # a word no member has (another autorl's) is kept as it is
    root_cause_line: str
    was_category: str | None
    was_root_cause: str | None
    family_id: str
    created: float

    @classmethod
    def read(cls, row: dict[str, Any]) -> CrashLabel:
        category: CrashCategory | str = row["category"]
        try:
            category = CrashCategory(category)
        except ValueError:
            pass
        values: dict[str, Any] = {f.name: row.get(f.name) for f in fields(cls)}
        return cls(**{**values, "category": category})

    def as_dict(self) -> dict[str, Any]:
        """Every column, the category as its word (for ``--json`` output)."""
        return {
            f.name: str(v) if isinstance(v, CrashCategory) else v for f in fields(self) for v in [getattr(self, f.name)]
        }


def _row_id(pk: Any) -> int:
    """The id SQLite gave an inserted row (an integer primary key is never None once inserted)."""
    if not isinstance(pk, int):
        raise TypeError(f"an inserted row's id is {pk!r}, not an integer")
    return pk


def open_read(path: str | Path) -> Ledger:
    """The ledger at ``path`` for reading only (the review commands): nothing is created or written, except the
    migrations a ledger of an older autorl still needs."""
    path = Path(path)
    if not path.is_file():
        raise NotFoundError(f"no ledger at {short(path, 200)}: run a study first with `autorl run`")
    ledger = Ledger(path, readonly=True)
    with translated_errors(path):
        pending = pending_migrations(ledger.db)
        made = ledger.db.execute("SELECT 1 FROM sqlite_master WHERE name = 'autorl_migrations'").fetchone()
    if not made:  # an empty file, or an empty database: a review command does not make it a ledger
        ledger.close()
        raise NotFoundError(
            f"{short(path, 200)} holds no autorl ledger (no tables): run a study first with "
            "`autorl run`, or pass your ledger with --ledger FILE"
        )
    if pending:
        ledger.close()
        Ledger(path).close()
        ledger = Ledger(path, readonly=True)
    ledger.damage = ledger.file.damage(ledger.db)
    return ledger


def ledger_guard(path: Path) -> None:
    """Fail early, before anything is written, if the ledger cannot be written or read: a path that is not a file,
    a folder that is not there or not writable, a disk with no room, a file that is not an autorl ledger, a
    damaged one (every page is checked)."""
    check_path(path)
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


translate_all(Ledger)
translate_all(StudyRecords)
translate_all(CrashLabels)
