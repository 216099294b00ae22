"""ledger.sqlite: the one record of every study, trial, metric and event.

All SQL lives here. Tables are prefixed ``autorl_`` so Optuna's own tables (its RDB
storage lives in the same file, so ``optuna-dashboard sqlite:///ledger.sqlite``
opens the study) never collide. WAL mode, and one transaction per state change:
a kill at any instant leaves a ledger that opens, passes ``PRAGMA
integrity_check`` and resumes. The schema is versioned by ``MIGRATIONS``
(recorded in ``autorl_migrations``).
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import sqlite_utils

from autorl.errors import NotFoundError, WorkspaceError

TRIAL_COLUMNS: dict[str, str] = {
    "id": "Row id.",
    "study_id": "The study this trial belongs to.",
    "number": "Attempt number NN (unique per workspace).",
    "attempt": "Attempt name = branch, e.g. attempt-07-lr-3e-4.",
    "branch": "Git branch of the trial.",
    "start_tag": "Tag on the commit the trial ran (attempt-NN-start).",
    "end_tag": "Tag on the commit with its results (attempt-NN-end).",
    "start_sha": "Commit SHA the trial ran.",
    "end_sha": "Commit SHA with the results file and research-log entry.",
    "proposer": "Who proposed it: baseline, optuna, random, hypothesis (ranked), move (a direction-aware move "
                "rule, autorl/data/rules/moves.yaml), confirm, retry, promote.",
    "hypothesis": "Hypothesis id tested (NULL for plain search).",
    "why": "Why it was chosen (the diagnosis that led there).",
    "params": "JSON of the full train block run.",
    "changed": "JSON of the values that differ from the baseline recipe.",
    "seed": "Seed the trial ran with.",
    "optuna_number": "Optuna trial number (join key with Optuna's tables).",
    "status": "running, complete, pruned, crash, budget-cut, interrupted, timeout, config-error.",
    "verdict": "improved, regressed, flat, crash, pruned (NULL while running or for a baseline).",
    "reason": "One line: why this status/verdict.",
    "objective": "Objective value (NULL for a crash; never a placeholder).",
    "delta": "Gain over the trial's parent (the recipe it modifies), better-is-positive.",
    "gap_to_best": "Objective minus the best objective of the study's earlier trials (the incumbent), better-is-positive.",
    "ci_low": "Lower end of the interval for delta.",
    "ci_high": "Upper end of the interval for delta.",
    "parent": "Attempt number of the parent the trial was judged against (NULL = the baseline).",
    "gain_vs_baseline": "Gain over the study's original baseline, reported apart from the verdict.",
    "confirmation": "For an improved trial: candidate, confirmed or rejected (fresh-seed re-runs decide).",
    "confirms": "Attempt number of the candidate this confirmation run re-runs.",
    "method": "How the interval was computed.",
    "n_items": "Eval items (or repeats) behind the interval.",
    "flags": "JSON list of flags with evidence (divergence, truncation, ...).",
    "crash_category": "Triage category of a crash.",
    "crash_action": "What triage decided for a crash: retry_reduced, retry_once, record or stop (a retry not yet run "
                    "when the controller stopped is queued again on resume).",
    "crash_signature": "Stable signature grouping identical failures.",
    "root_cause": "The log line a person would point at.",
    "remedy": "What to do about the crash.",
    "retry_of": "Attempt number of the crashed trial this retries.",
    "promoted_from": "Attempt number a full run was promoted from.",
    "kind": "trial or full.",
    "started": "Unix time the trial started.",
    "finished": "Unix time it ended.",
    "duration_s": "Wall seconds.",
    "log_path": "The run's log file.",
    "metrics_path": "The run's metrics JSONL.",
    "exit_code": "Exit code of the run (NULL if it never exited).",
    "pid": "Process group of the running trial (for cleanup on resume).",
    "job_id": "Ray job id of the running trial (for cleanup on resume).",
    "job_address": "Ray dashboard address the job was submitted to.",
}


def _v1(db: sqlite_utils.Database) -> None:
    db["autorl_studies"].create({
        "id": int, "name": str, "recipe_path": str, "recipe": str, "base_sha": str,
        "strategy": str, "budget_s": float, "created": float, "status": str,
        "optuna_study": str, "baseline_value": float,
    }, pk="id")
    db["autorl_studies"].create_index(["name"], unique=True)
    later = ("job_id", "job_address", "gap_to_best", "parent", "gain_vs_baseline", "confirmation", "confirms",
             "crash_action")
    types = {c: str for c in TRIAL_COLUMNS if c not in later}
    types.update({c: int for c in ("id", "study_id", "number", "seed", "optuna_number", "retry_of",
                                   "promoted_from", "exit_code", "pid", "n_items")})
    types.update({c: float for c in ("objective", "delta", "ci_low", "ci_high", "started", "finished", "duration_s")})
    db["autorl_trials"].create(types, pk="id", foreign_keys=[("study_id", "autorl_studies")])
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


MIGRATIONS = [("0001_initial", _v1), ("0002_ray_jobs", _v2), ("0003_gap_to_best", _v3), ("0004_confirmation", _v4),
              ("0005_resume_queue", _v5)]
# A run the controller stopped (Ctrl-C, a kill recovered on resume, the budget's end) did not reach its own end:
# a confirmation or retry stopped that way is run again on resume.
STOPPED_EARLY = ("interrupted", "budget-cut")
_STOPPED_SQL = "(" + ", ".join(f"'{status}'" for status in STOPPED_EARLY) + ")"


class Ledger:
    """The ledger of one workspace. Every write is one transaction."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.db = _open(self.path)
        self.migrate()

    # ---- schema ---------------------------------------------------------
    def migrate(self) -> None:
        with self.tx():
            self.db.execute("CREATE TABLE IF NOT EXISTS autorl_migrations (name TEXT PRIMARY KEY, applied REAL)")
        done = {r[0] for r in self.db.execute("SELECT name FROM autorl_migrations").fetchall()}
        for name, step in MIGRATIONS:
            if name in done:
                continue
            with self.tx():
                step(self.db)
                self.db.execute("INSERT INTO autorl_migrations VALUES (?, ?)", [name, time.time()])

    @contextmanager
    def tx(self) -> Iterator[None]:
        """One IMMEDIATE transaction (rolled back on any error)."""
        conn = self.db.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # ---- studies ----------------------------------------------------------
    def create_study(self, **row: Any) -> int:
        with self.tx():
            return self.db["autorl_studies"].insert({"created": time.time(), "status": "running", **row}).last_pk

    def study(self, name: str | None = None, study_id: int | None = None) -> dict:
        """A study by name or id; the latest when neither is given."""
        where, args = ("name = ?", [name]) if name else ("id = ?", [study_id]) if study_id else ("1", [])
        rows = list(self.db["autorl_studies"].rows_where(where, args, order_by="id desc", limit=1))
        if not rows:
            raise NotFoundError(f"no study {name or study_id or ''} in {self.path}: start one with `autorl run`".replace("  ", " "))
        return _decode(rows[0])

    def has_study(self, name: str) -> bool:
        return bool(self.db.execute("SELECT 1 FROM autorl_studies WHERE name = ?", [name]).fetchone())

    def studies(self, limit: int = 5) -> list[dict]:
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
        with self.tx():
            self.db["autorl_studies"].update(study_id, values)

    def set_base_changes(self, study_id: int, changes: dict[str, Any], line: str) -> None:
        """Record the train values the study's base recipe now carries (and why, as a ``base-recipe`` event)."""
        with self.tx():
            self.db["autorl_studies"].update(study_id, {"base_changes": _jsonify(changes)})
            self._event(study_id, None, "base-recipe", line)

    # ---- trials -------------------------------------------------------------
    def add_trial(self, **row: Any) -> int:
        row = {k: _jsonify(v) for k, v in row.items()}
        with self.tx():
            tid = self.db["autorl_trials"].insert({"status": "running", "kind": "trial", **row}).last_pk
            self._event(row.get("study_id"), tid, "trial-start", row.get("attempt", ""))
        return tid

    def update_trial(self, trial_id: int, event: str | None = None, **values: Any) -> None:
        values = {k: _jsonify(v) for k, v in values.items()}
        with self.tx():
            self.db["autorl_trials"].update(trial_id, values)
            if event:
                row = self.db["autorl_trials"].get(trial_id)
                self._event(row["study_id"], trial_id, event, values.get("reason") or values.get("status") or "")

    def trial(self, number: int) -> dict:
        rows = list(self.db["autorl_trials"].rows_where("number = ?", [number]))
        if not rows:
            raise NotFoundError(f"no trial {number:02d} in the ledger: list them with `autorl ledger`")
        return _decode(rows[0])

    def trials(self, study_id: int | None = None, **equal: Any) -> list[dict]:
        """Trials in attempt order, optionally of one study and with columns equal to values (e.g. kind="full")."""
        unknown = set(equal) - set(TRIAL_COLUMNS)
        if unknown:
            raise ValueError(f"no trial column {sorted(unknown)}")
        return self._trials(" AND ".join([f"{k} = ?" for k in equal] or ["1"]), list(equal.values()), study_id)

    # named queries: every condition on trials beyond plain equality lives here
    def baselines(self, study_id: int) -> list[dict]:
        """The study's baseline runs (the recipe as written, every seed). A baseline that crashed and was
        retried (triage's retry of a hang, timeout, network error or OOM) is replaced by its retry."""
        where = ("kind = 'trial' AND (proposer = 'baseline' OR (proposer = 'retry' AND retry_of IN "
                 "(SELECT number FROM autorl_trials WHERE proposer = 'baseline'))) "
                 "AND number NOT IN (SELECT retry_of FROM autorl_trials WHERE retry_of IS NOT NULL)")
        return self._trials(where, [], study_id)

    def crashed(self, study_id: int | None = None) -> list[dict]:
        """Trials that crashed (verdict or status crash)."""
        return self._trials("verdict = 'crash' OR status = 'crash'", [], study_id)

    def crash_signatures(self, study_id: int) -> list[dict]:
        """Crashed trials that have a triage signature."""
        return self._trials("verdict = 'crash' AND crash_signature IS NOT NULL", [], study_id)

    def scored(self, study_id: int) -> list[dict]:
        """The study's trials (not full runs) that have an objective value."""
        return self._trials("objective IS NOT NULL AND kind = 'trial'", [], study_id)

    def hypothesis_counts(self) -> dict[str, dict[str, int]]:
        """Per hypothesis id: finished trials that tested it (confirmation runs apart), how many of them a move
        rule proposed, and their candidates, confirmed and rejected improvements."""
        q = ("SELECT hypothesis, count(*), sum(proposer = 'move'), sum(verdict = 'improved'), "
             "sum(confirmation = 'confirmed'), sum(confirmation = 'rejected') FROM autorl_trials "
             "WHERE hypothesis IS NOT NULL AND confirms IS NULL AND kind = 'trial' AND status != 'running' "
             "GROUP BY hypothesis")
        keys = ("tried", "moves", "candidates", "confirmed", "rejected")
        return {r[0]: dict(zip(keys, (int(v or 0) for v in r[1:]))) for r in self.db.execute(q).fetchall()}

    def unfinished(self) -> list[dict]:
        """Trials still marked running, and full runs that have not been closed."""
        return self._trials("status = 'running' OR (kind = 'full' AND end_tag IS NULL)", [], None)

    def _trials(self, where: str, args: list, study_id: int | None) -> list[dict]:
        if study_id is not None:
            where, args = f"({where}) AND study_id = ?", args + [study_id]
        return [_decode(r) for r in self.db["autorl_trials"].rows_where(where, args, order_by="number")]

    def confirmed(self, study_id: int) -> list[dict]:
        """The study's trials whose improvement fresh-seed re-runs confirmed."""
        return self.trials(study_id, confirmation="confirmed", kind="trial")

    def confirm_runs(self, study_id: int, candidate: int, ran: bool = False) -> list[dict]:
        """The confirmation runs of candidate ``candidate`` (an attempt number); with ``ran``, only those the
        controller did not stop early (see ``STOPPED_EARLY``)."""
        where = "confirms = ? AND kind = 'trial'" + (f" AND status NOT IN {_STOPPED_SQL}" if ran else "")
        return self._trials(where, [candidate], study_id)

    def open_candidates(self, study_id: int) -> list[dict]:
        """Improved trials whose fresh-seed confirmation has not decided yet (neither confirmed nor rejected)."""
        return self.trials(study_id, confirmation="candidate", kind="trial")

    def unretried_crashes(self, study_id: int) -> list[dict]:
        """Crashed first runs (not a retry, not a confirmation run) with no retry that ran: no retry row, or
        only retries the controller stopped early. Whether triage wanted a retry is in ``crash_action``."""
        where = ("kind = 'trial' AND status = 'crash' AND retry_of IS NULL AND confirms IS NULL AND number NOT IN "
                 f"(SELECT retry_of FROM autorl_trials WHERE retry_of IS NOT NULL AND status NOT IN {_STOPPED_SQL})")
        return self._trials(where, [], study_id)

    def confirm_groups(self, study_id: int) -> dict[int, list[dict]]:
        """Completed confirmation runs by candidate number (replicate groups for the run-noise estimate)."""
        out: dict[int, list[dict]] = {}
        for row in self._trials("confirms IS NOT NULL AND status = 'complete' AND kind = 'trial'", [], study_id):
            out.setdefault(row["confirms"], []).append(row)
        return out

    def set_confirmation(self, number: int, state: str, reason: str) -> None:
        """Mark trial ``number`` candidate, confirmed or rejected, with why."""
        row = self.trial(number)
        self.update_trial(row["id"], event=f"confirmation-{state}", confirmation=state,
                          reason=f"{row.get('reason') or ''} | {state}: {reason}".lstrip(" |"))

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
            self._event(study_id, trial_id, kind, message)

    def events(self, study_id: int | None = None, limit: int = 50) -> list[dict]:
        where, args = ("study_id = ?", [study_id]) if study_id else ("1", [])
        return list(self.db["autorl_events"].rows_where(where, args, order_by="id desc", limit=limit))

    def _event(self, study_id: int | None, trial_id: int | None, kind: str, message: str) -> None:
        self.db["autorl_events"].insert({"time": time.time(), "study_id": study_id, "trial_id": trial_id,
                                         "kind": kind, "message": message})

    def close(self) -> None:
        self.db.close()


def _open(path: Path) -> sqlite_utils.Database:
    if path.exists() and not path.is_file():
        raise WorkspaceError(f"ledger path {path} is not a file: pass --ledger FILE")
    if not path.parent.is_dir():
        raise WorkspaceError(f"ledger directory {path.parent} does not exist: create it or pass another --ledger")
    try:
        conn = sqlite3.connect(str(path), timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
    except sqlite3.DatabaseError as exc:
        hint = "it is not a ledger (or is corrupt)" if path.exists() else "cannot create it"
        raise WorkspaceError(f"ledger {path}: {hint} ({exc}): check permissions or pass another --ledger") from None
    return sqlite_utils.Database(conn)


def _jsonify(v: Any) -> Any:
    return json.dumps(v, sort_keys=True, default=str) if isinstance(v, (dict, list)) else v


def _decode(row: dict) -> dict:
    out = dict(row)
    for key in ("params", "changed", "flags", "base_changes"):
        if isinstance(out.get(key), str):
            try:
                out[key] = json.loads(out[key])
            except json.JSONDecodeError:
                pass
    return out


def ledger_guard(path: Path) -> None:
    """Fail early, before anything is written, if the ledger cannot be written."""
    import os

    target = path if path.exists() else path.parent
    if not target.exists():
        raise WorkspaceError(f"ledger directory {path.parent} does not exist: create it or pass another --ledger")
    if not os.access(target, os.W_OK):
        raise WorkspaceError(f"ledger {path} is not writable: fix its permissions or pass another --ledger")
    if path.exists():
        _check_readable(path)


def _check_readable(path: Path) -> None:
    try:
        conn = sqlite3.connect(str(path))
        conn.execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
        conn.close()
    except sqlite3.DatabaseError as exc:
        raise WorkspaceError(f"ledger {path} is not a SQLite database ({exc}): move it away or pass another --ledger") from None
