"""The ledger's schema, one migration at a time: each frozen as it shipped (a new column is a new migration,
never an edit of an old one), each applied in its own transaction and recorded in ``autorl_migrations``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import sqlite_utils

# ---- migrations: each one frozen as it shipped (a new column is a new migration, never an edit of an old one) ----
# The first schema's tables, as 0001_initial created them.
_V1_STUDIES = {
    "id": int,
    "name": str,
    "recipe_path": str,
    "recipe": str,
    "base_sha": str,
    "strategy": str,
    "budget_s": float,
    "created": float,
    "status": str,
    "optuna_study": str,
    "baseline_value": float,
}
_V1_TRIALS = {
    "id": int,
    "study_id": int,
    "number": int,
    "attempt": str,
    "branch": str,
    "start_tag": str,
    "end_tag": str,
    "start_sha": str,
    "end_sha": str,
    "proposer": str,
    "hypothesis": str,
    "why": str,
    "params": str,
    "changed": str,
    "seed": int,
    "optuna_number": int,
    "status": str,
    "verdict": str,
    "reason": str,
    "objective": float,
    "delta": float,
    "ci_low": float,
    "ci_high": float,
    "method": str,
    "n_items": int,
    "flags": str,
    "crash_category": str,
    "crash_signature": str,
    "root_cause": str,
    "remedy": str,
    "retry_of": int,
    "promoted_from": int,
    "kind": str,
    "started": float,
    "finished": float,
    "duration_s": float,
    "log_path": str,
    "metrics_path": str,
    "exit_code": int,
    "pid": int,
}


def _v1(db: sqlite_utils.Database) -> None:
    db.table("autorl_studies").create(
        _V1_STUDIES,
        pk="id",
    )
    db.table("autorl_studies").create_index(["name"], unique=True)
    db.table("autorl_trials").create(
        _V1_TRIALS,
        pk="id",
        foreign_keys=[("study_id", "autorl_studies")],
    )
    db.table("autorl_trials").create_index(["number"], unique=True)
    db.table("autorl_metrics").create(
        {"trial_id": int, "step": int, "type": str, "data": str}, foreign_keys=[("trial_id", "autorl_trials")]
    )
    db.table("autorl_metrics").create_index(["trial_id", "step"])
    db.table("autorl_events").create(
        {"id": int, "time": float, "study_id": int, "trial_id": int, "kind": str, "message": str}, pk="id"
    )


def _v2(db: sqlite_utils.Database) -> None:
    db.table("autorl_trials").add_column("job_id", str)
    db.table("autorl_trials").add_column("job_address", str)


def _v3(db: sqlite_utils.Database) -> None:
    db.table("autorl_trials").add_column("gap_to_best", float)


def _v4(db: sqlite_utils.Database) -> None:
    for col, kind in (("parent", int), ("gain_vs_baseline", float), ("confirmation", str), ("confirms", int)):
        db.table("autorl_trials").add_column(col, kind)


def _v5(db: sqlite_utils.Database) -> None:
    db.table("autorl_trials").add_column("crash_action", str)
    db.table("autorl_studies").add_column("base_changes", str)


def _v6(db: sqlite_utils.Database) -> None:
    for col, kind in (
        ("test", str),
        ("trial_sd", float),
        ("parent_sd", float),
        ("fp_rate", float),
        ("confirm_test", str),
        ("confirm_trial_sd", float),
        ("confirm_parent_sd", float),
        ("confirm_fp_rate", float),
    ):
        db.table("autorl_trials").add_column(col, kind)


def _v7_hack_gate(db: sqlite_utils.Database) -> None:
    db.table("autorl_trials").add_column("gate", str)
    db.table("autorl_trials").add_column("gate_checks", str)


def _v8_first_step(db: sqlite_utils.Database) -> None:
    db.table("autorl_trials").add_column("first_step", float)


def _v9_revisions(db: sqlite_utils.Database) -> None:
    """``rev``: every insert or update of a trial row gives it the next revision (one past the highest; writers
    take turns, so revisions grow in commit order). A reader that has seen revisions up to R re-reads only rows
    above R, whichever process wrote them. The guard ``NEW.rev IS OLD.rev`` keeps the trigger's own update from
    firing again."""
    db.table("autorl_trials").add_column("rev", int)
    db.execute("UPDATE autorl_trials SET rev = id")
    db.table("autorl_trials").create_index(["rev"])
    bump = "UPDATE autorl_trials SET rev = (SELECT coalesce(max(rev), 0) + 1 FROM autorl_trials) WHERE id = NEW.id;"
    db.execute(f"CREATE TRIGGER autorl_trials_rev_insert AFTER INSERT ON autorl_trials BEGIN {bump} END")
    db.execute(
        "CREATE TRIGGER autorl_trials_rev_update AFTER UPDATE ON autorl_trials WHEN NEW.rev IS OLD.rev "
        f"BEGIN {bump} END"
    )


def _v10_crash_labels(db: sqlite_utils.Database) -> None:
    """``autorl_crash_labels``: a person's correction of triage's call on a crashed trial (``autorl triage label``):
    the category and root-cause line they gave, what triage had said, and the workspace family made from it."""
    db.table("autorl_crash_labels").create(
        {
            "id": int,
            "trial_id": int,
            "number": int,
            "category": str,
            "root_cause_line": str,
            "was_category": str,
            "was_root_cause": str,
            "family_id": str,
            "created": float,
        },
        pk="id",
    )
    db.table("autorl_crash_labels").create_index(["trial_id"])


def _v11_warm_pools(db: sqlite_utils.Database) -> None:
    """``warm_pool`` and ``warm_index``: the warm pool a trial ran in and its place there (0: the trial that built
    the pool); NULL for a trial that ran as its own process or job."""
    db.table("autorl_trials").add_column("warm_pool", str)
    db.table("autorl_trials").add_column("warm_index", int)


MIGRATIONS = [
    ("0001_initial", _v1),
    ("0002_ray_jobs", _v2),
    ("0003_gap_to_best", _v3),
    ("0004_confirmation", _v4),
    ("0005_resume_queue", _v5),
    ("0006_error_rates", _v6),
    ("0007_hack_gate", _v7_hack_gate),
    ("0008_first_step", _v8_first_step),
    ("0009_revisions", _v9_revisions),
    ("0010_crash_labels", _v10_crash_labels),
    ("0011_warm_pools", _v11_warm_pools),
]


def migrate(db: sqlite_utils.Database, tx: Callable[[], Any]) -> None:
    """The migrations the ledger lacks, each one transaction with its own record. The record table is made in
    the first one's transaction, so a reader never sees it without the tables it stands for."""
    pending = set(pending_migrations(db))
    for name, step in MIGRATIONS:
        if name not in pending:
            continue
        with tx():
            db.execute("CREATE TABLE IF NOT EXISTS autorl_migrations (name TEXT PRIMARY KEY, applied REAL)")
            step(db)
            db.execute("INSERT INTO autorl_migrations VALUES (?, ?)", [name, time.time()])


def pending_migrations(db: sqlite_utils.Database) -> list[str]:
    """The migrations the ledger has not had yet."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'autorl_migrations'").fetchone():
        return [name for name, _ in MIGRATIONS]
    done = {r[0] for r in db.execute("SELECT name FROM autorl_migrations").fetchall()}
    return [name for name, _ in MIGRATIONS if name not in done]
