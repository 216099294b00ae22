"""One study's rows kept in memory and current with the file (``StudyRows``), and the views its queries are
answered from, each kept up to date one changed row at a time."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import sqlite_utils

from autorl.ledger.rows import Trial, decode, select
from autorl.states import STOPPED_EARLY, Kind, Proposer, TrialStatus


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

    def __init__(self, db: sqlite_utils.Database, study_id: int):
        self.db, self.study_id = db, study_id
        self.by_id: dict[int, Trial] = {}
        self.by_number: dict[int, Trial] = {}
        self.all = _Ordered()  # every row, in attempt order
        self.views: dict[Any, Any] = {}  # Subset, Derived and Index views, by query
        self.rev = 0  # the highest revision read
        self.mark: tuple[int, int] | None = None  # (data_version, total_changes) the rows were current at
        self.reads, self.rows_read = 0, 0  # SELECTs of trial rows made, rows they returned (tests count them)

    def current(self) -> bool:
        """Bring the rows up to date; False inside an open transaction (then use ``fresh``)."""
        conn = self.db.conn
        if conn.in_transaction:
            return False
        mark = (conn.execute("PRAGMA data_version").fetchone()[0], conn.total_changes)
        if mark != self.mark:
            top = conn.execute("SELECT max(rev) FROM autorl_trials").fetchone()[0] or 0
            if top > self.rev:
                self.reads += 1
                rows = self.db.query(
                    "SELECT * FROM autorl_trials WHERE rev > ? AND rev <= ? AND study_id = ?",
                    [self.rev, top, self.study_id],
                )
                self._take([decode(r) for r in rows])
                self.rev = top
            self.mark = mark
        return True

    def _take(self, rows: list[Trial]) -> None:
        self.rows_read += len(rows)
        for row in rows:
            old = self.by_id.get(row.id)
            self.by_id[row.id] = row
            if old is not None and old.number is not None:
                self.by_number.pop(old.number, None)
            if row.number is not None:
                self.by_number[row.number] = row
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

    def fresh(self) -> list[Trial]:
        """The study's rows read now, past the cache (inside a transaction)."""
        rows = select(self.db, "1", [], self.study_id)
        self.reads, self.rows_read = self.reads + 1, self.rows_read + len(rows)
        return rows


def attempt_order(row: Trial) -> tuple[bool, int, int]:
    return row.number is not None, row.number or 0, row.id


class _Ordered:
    """Rows in ``order`` (attempt order by default); ``put(old, new)`` replaces a row's old version with its new
    one (None: none)."""

    def __init__(self, order: Callable[[Trial], tuple] | None = None) -> None:
        self.order = order or attempt_order
        self.keys: list[tuple] = []
        self.rows: list[Trial] = []

    def put(self, old: Trial | None, new: Trial | None) -> None:
        if old is not None:
            at = bisect.bisect_left(self.keys, self.order(old))
            if at < len(self.keys) and self.rows[at].id == old.id:
                if new is not None and self.order(new) == self.keys[at]:
                    self.rows[at] = new
                    return
                del self.keys[at], self.rows[at]
        if new is not None:
            key = self.order(new)
            at = len(self.keys) if not self.keys or key > self.keys[-1] else bisect.bisect_left(self.keys, key)
            self.keys.insert(at, key)
            self.rows.insert(at, new)


class Subset:
    """The rows ``keep`` keeps, in attempt order (or ``order``), kept up to date row by row."""

    def __init__(self, keep: Callable[[Trial], bool], order: Callable[[Trial], tuple] | None = None):
        self.keep, self.kept = keep, _Ordered(order)

    def fill(self, rows: list[Trial]) -> None:
        for row in rows:
            self.put(None, row)

    def put(self, old: Trial | None, new: Trial) -> None:
        self.kept.put(old if old is not None and self.keep(old) else None, new if self.keep(new) else None)

    def value(self) -> list[Trial]:
        return self.kept.rows


class Derived:
    """A value computed from all the study's rows (``compute``), computed again only after a row that
    ``touches`` it changed; ``fold(value, old, new)`` may bring it up to date at once (``_STALE``: it cannot)."""

    def __init__(
        self,
        compute: Callable[[list[Trial]], Any],
        touches: Callable[[Trial], bool],
        fold: Callable[[Any, Trial | None, Trial], Any] | None = None,
    ):
        self.compute, self.touches, self.fold = compute, touches, fold
        self.rows: list[Trial] = []
        self.kept: Any = _STALE

    def fill(self, rows: list[Trial]) -> None:
        self.rows = rows  # the list _Ordered keeps: computed from as it is when asked

    def put(self, old: Trial | None, new: Trial) -> None:
        if self.kept is _STALE or not (self.touches(new) or (old is not None and self.touches(old))):
            return
        self.kept = self.fold(self.kept, old, new) if self.fold is not None else _STALE

    def value(self) -> Any:
        if self.kept is _STALE:
            self.kept = self.compute(self.rows)
        return self.kept


_STALE = object()


class Index:
    """Rows by a hashable summary of their train values (``_params_key``), kept up to date row by row."""

    def __init__(self) -> None:
        self.rows: dict[Any, dict[int, Trial]] = {}

    def fill(self, rows: list[Trial]) -> None:
        for row in rows:
            self.put(None, row)

    def put(self, old: Trial | None, new: Trial) -> None:
        if old is not None:
            self.rows.get(_params_key(old.params), {}).pop(old.id, None)
        self.rows.setdefault(_params_key(new.params), {})[new.id] = new

    def value(self, params: dict[str, Any]) -> list[Trial]:
        """The rows that may have run ``params`` (to be compared in full), in attempt order."""
        return sorted(self.rows.get(_params_key(params), {}).values(), key=attempt_order)


def _params_key(params: Any) -> Any:
    """What equal train blocks share (their scalar values; 1 and 1.0 hash alike, as they compare equal)."""
    if not isinstance(params, dict):
        return None
    return frozenset((k, v) for k, v in params.items() if v is None or isinstance(v, (bool, int, float, str)))


def baselines_of(rows: list[Trial]) -> list[Trial]:
    """``Ledger.baselines`` over one study's rows (a retry is always of its own study's trial)."""
    first = {r.number for r in rows if r.proposer == Proposer.BASELINE}
    retried = {r.retry_of for r in rows if r.retry_of is not None}
    return [
        r
        for r in rows
        if r.kind == Kind.TRIAL
        and r.number not in retried
        and (r.proposer == Proposer.BASELINE or (r.proposer == Proposer.RETRY and r.retry_of in first))
    ]


def in_baselines(row: Trial) -> bool:
    """A row whose change can change ``baselines_of``: a baseline, a retry, or a row that retries another."""
    return row.proposer in (Proposer.BASELINE, Proposer.RETRY) or row.retry_of is not None


def unretried(rows: list[Trial]) -> list[Trial]:
    ran = {r.retry_of for r in rows if r.retry_of is not None and ran_to_end(r)}
    return [
        r
        for r in rows
        if r.kind == Kind.TRIAL
        and r.status == TrialStatus.CRASH
        and r.retry_of is None
        and r.confirms is None
        and r.number not in ran
    ]


def in_unretried(row: Trial) -> bool:
    """A row whose change can change ``unretried``: a crash, or a retry."""
    return row.status == TrialStatus.CRASH or row.retry_of is not None


def ran_to_end(row: Trial) -> bool:
    """Not stopped early by the controller (SQL's ``status NOT IN STOPPED_EARLY``: a NULL status is not)."""
    return row.status is not None and row.status not in STOPPED_EARLY


def finished_row(row: Trial) -> bool:
    return (
        row.kind == Kind.TRIAL
        and row.status == TrialStatus.COMPLETE
        and row.started is not None
        and row.finished is not None
    )


def _end_of(row: Trial | None) -> float | None:
    """When a trial (not a full run) that started ended, or None."""
    if row is None or row.kind != Kind.TRIAL or row.started is None:
        return None
    return row.finished


def first_end_view() -> Derived:
    """The earliest end of the study's trials that started, kept up to date as trials end."""
    return Derived(
        lambda rows: min((v for v in map(_end_of, rows) if v is not None), default=None),
        lambda r: _end_of(r) is not None,
        _folding(_end_of, min),
    )


def _folding(of: Callable[[Trial | None], Any], pick: Callable[..., Any]) -> Callable[..., Any]:
    """The fold of an aggregate ``pick`` (min, max) over each row's ``of``: a row that gains a value is picked in
    at once; one whose value changed or went makes it stale."""

    def fold(kept: Any, old: Trial | None, new: Trial) -> Any:
        before, after = of(old), of(new)
        if before == after:
            return kept
        if before is None:
            return after if kept is None else pick(kept, after)
        return _STALE

    return fold


def objective_of(row: Trial | None) -> float | None:
    """A trial's (not a full run's) objective, or None."""
    return row.objective if row is not None and row.kind == Kind.TRIAL else None


def best_view(maximize: bool) -> Derived:
    """The best objective of the study's trials, kept up to date as trials end."""
    pick = max if maximize else min
    return Derived(
        lambda rows: pick((v for v in map(objective_of, rows) if v is not None), default=None),
        lambda r: objective_of(r) is not None,
        _folding(objective_of, pick),
    )
