"""The rows of the ledger's tables: each column's type and meaning, the check every write passes, the
decoding of JSON columns, and the two statements every part of the ledger shares (a study's trials, an event)."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, fields
from typing import Any, TypeVar, get_type_hints

import sqlite_utils
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from autorl.errors import validation_line
from autorl.states import (
    Confirmation,
    CrashAction,
    CrashCategory,
    Gate,
    Kind,
    Proposer,
    StudyStatus,
    TrialStatus,
    Verdict,
    Word,
)

R = TypeVar("R", bound="_Row")


def col(doc: str) -> Any:
    """A column: None until written, and its meaning (docs/ledger.md is generated from it). A column every row
    read from the ledger has (its id, number, status ...) is typed without None; a row a test builds may lack it."""
    return dataclasses.field(default=None, metadata={"doc": doc})


@dataclass(frozen=True, slots=True)
class _Row:
    """What every row type shares: a changed copy, a plain dict for JSON, and the columns read from SQLite."""

    def replace(self: R, **changes: Any) -> R:
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """Every column, states as their words (for ``--json`` output)."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def read(cls: type[R], row: dict[str, Any]) -> R:
        """The row SQLite returned: JSON columns decoded, state columns as their enums (a word no member has, from
        another autorl, is kept as it is)."""
        values = {}
        for f in fields(cls):
            v = row.get(f.name)
            if f.name in JSON_COLUMNS and isinstance(v, str):
                try:
                    v = json.loads(v)
                except json.JSONDecodeError:
                    pass
            word = _STATES.get((cls.__name__, f.name))
            if word is not None and v is not None:
                try:
                    v = word(v)
                except ValueError:
                    pass
            values[f.name] = v
        return cls(**values)


def _plain(v: Any) -> Any:
    return v.value if isinstance(v, Word) else v


JSON_COLUMNS = ("params", "changed", "flags", "base_changes", "gate_checks")


@dataclass(frozen=True, slots=True)
class Trial(_Row):
    """One row of ``autorl_trials`` as the ledger writes and reads it: each column's type and meaning (docs/ledger.md
    is generated from these fields). Writes are validated against them; JSON columns come back decoded, state
    columns as the enums of ``autorl.states``. Immutable: ``replace`` makes a changed copy."""

    id: int = col("Row id.")
    study_id: int = col("The study this trial belongs to.")
    number: int = col("Attempt number NN (unique per workspace).")
    attempt: str = col("Attempt name = branch, e.g. attempt-07-lr-3e-4.")
    branch: str | None = col("Git branch of the trial.")
    start_tag: str | None = col("Tag on the commit the trial ran (attempt-NN-start).")
    end_tag: str | None = col("Tag on the commit with its results (attempt-NN-end).")
    start_sha: str | None = col("Commit SHA the trial ran.")
    end_sha: str | None = col("Commit SHA with the results file and research-log entry.")
    proposer: Proposer | None = col(
        "Who proposed it: baseline, optuna, random, hypothesis (ranked), move (a direction-aware move rule, "
        "autorl/data/rules/moves.yaml), confirm, retry, promote."
    )
    hypothesis: str | None = col("Hypothesis id tested (NULL for plain search).")
    why: str | None = col("Why it was chosen (the diagnosis that led there).")
    params: dict[str, Any] | None = col("JSON of the full train block run.")
    changed: dict[str, Any] | None = col("JSON of the values that differ from the baseline recipe.")
    seed: int | None = col("Seed the trial ran with.")
    optuna_number: int | None = col("Optuna trial number (join key with Optuna's tables).")
    status: TrialStatus = col(
        "running, complete, pruned, crash, budget-cut, interrupted, timeout, hang, config-error, early-stopped (a "
        "full run its OOD early stop ended)."
    )
    verdict: Verdict | None = col("improved, regressed, flat, crash, pruned (NULL while running or for a baseline).")
    reason: str | None = col("One line: why this status/verdict.")
    objective: float | None = col("Objective value (NULL for a crash; never a placeholder).")
    delta: float | None = col("Gain over the trial's parent (the recipe it modifies), better-is-positive.")
    gap_to_best: float | None = col(
        "Objective minus the best objective of the study's earlier trials (the incumbent), better-is-positive."
    )
    ci_low: float | None = col("Lower end of the interval for delta.")
    ci_high: float | None = col("Upper end of the interval for delta.")
    parent: int | None = col("Attempt number of the parent the trial was judged against (NULL = the baseline).")
    gain_vs_baseline: float | None = col("Gain over the study's original baseline, reported apart from the verdict.")
    confirmation: Confirmation | None = col(
        "For an improved trial: candidate, confirmed or rejected (fresh-seed re-runs decide), or suspect "
        "(confirmed, but the hack gate failed: see gate_checks)."
    )
    confirms: int | None = col("Attempt number of the candidate this confirmation run re-runs.")
    method: str | None = col("How the interval was computed.")
    n_items: int | None = col("Eval items (or repeats) behind the interval.")
    flags: list[dict[str, Any]] | None = col("JSON list of flags with evidence (divergence, truncation, ...).")
    crash_category: CrashCategory | None = col("Triage category of a crash.")
    crash_action: CrashAction | None = col(
        "What triage decided for a crash: retry_reduced, retry_once, record or stop (a retry not yet run when the "
        "controller stopped is queued again on resume)."
    )
    crash_signature: str | None = col("Stable signature grouping identical failures.")
    root_cause: str | None = col("The log line a person would point at.")
    remedy: str | None = col("What to do about the crash.")
    test: str | None = col(
        "The test behind the verdict: what it compares, the t distribution's df and the interval's level."
    )
    trial_sd: float | None = col(
        "Run-to-run sd the verdict assumed for the trial's recipe (never below the parent's; larger where the "
        "trial's own runs or the study's other changed recipes showed more)."
    )
    parent_sd: float | None = col(
        "Run-to-run sd the verdict assumed for the parent's recipe (its replicate runs with the prior)."
    )
    fp_rate: float | None = col(
        "Calibrated false-positive rate of the verdict: the share of no-effect trials its test calls what it called "
        "this one (improved or regressed; flat: either), simulated at the noise it assumed."
    )
    confirm_test: str | None = col("The test behind a candidate's confirmation (its fresh-seed runs).")
    confirm_trial_sd: float | None = col("Run-to-run sd the confirmation assumed for the candidate's recipe.")
    confirm_parent_sd: float | None = col("Run-to-run sd the confirmation assumed for the parent's recipe.")
    confirm_fp_rate: float | None = col(
        "Calibrated false-positive rate of the confirmation: the share of no-effect candidates its test confirms "
        "(rejected: the same share), at the noise it assumed."
    )
    gate: Gate | None = col(
        "The hack gate at confirmation (and on a full run, at promote): ok, suspect (a check failed) or blind (no "
        "held-out task metric to check against)."
    )
    gate_checks: list[dict[str, Any]] | None = col(
        "JSON list of the hack gate's checks: name, ok (true/false/null = not measured), detail and the numbers "
        "behind it."
    )
    retry_of: int | None = col(
        "Attempt number of the crashed trial this retries, or of the lost full run this one starts over "
        "(`promote --resume`)."
    )
    promoted_from: int | None = col("Attempt number a full run was promoted from.")
    kind: Kind = col("trial or full.")
    started: float | None = col("Unix time the trial started.")
    finished: float | None = col("Unix time it ended.")
    duration_s: float | None = col("Wall seconds.")
    first_step: float | None = col(
        "Unix time the trial's first training step was logged: what came before it (process and job start-up, model "
        "load) does not grow with the trial's work."
    )
    log_path: str | None = col("The run's log file.")
    metrics_path: str | None = col("The run's metrics JSONL.")
    exit_code: int | None = col("Exit code of the run (NULL if it never exited).")
    pid: int | None = col("Process group of the running trial (for cleanup on resume).")
    job_id: str | None = col("Ray job id of the running trial (for cleanup on resume).")
    job_address: str | None = col("Ray dashboard address the job was submitted to.")
    warm_pool: str | None = col(
        "The warm pool the trial ran in (docs/warm-trials.md); NULL when it ran as its own process or job."
    )
    warm_index: int | None = col("The trial's place in its warm pool: 0 for the trial that built the pool.")
    rev: int | None = col(
        "Revision: set by the ledger's triggers on every insert and update of the row, higher than any revision "
        "before it, so a running study re-reads only the rows that changed (never written by autorl's code)."
    )


@dataclass(frozen=True, slots=True)
class Study(_Row):
    """One row of ``autorl_studies``."""

    id: int = col("Row id.")
    name: str = col("The study's name (unique in the ledger).")
    recipe_path: str | None = col("The recipe file the study started from.")
    recipe: str | None = col("The study's base recipe text as it ran.")
    base_sha: str | None = col("The commit every trial branches from.")
    strategy: str | None = col("The search strategy.")
    budget_s: float | None = col("Seconds of budget, summed over the study's sessions.")
    created: float | None = col("Unix time the study was made.")
    status: StudyStatus = col("running while a controller runs it, else stopped.")
    optuna_study: str | None = col("The name of its Optuna study in the same file.")
    baseline_value: float | None = col("The baseline's objective value.")
    base_changes: dict[str, Any] | None = col(
        "JSON of train values the base recipe carries since a reduced baseline retry."
    )


@dataclass(frozen=True, slots=True)
class Event(_Row):
    """One row of ``autorl_events``: something that happened to a study or a trial, in one line."""

    id: int = col("Row id.")
    time: float = col("Unix time.")
    study_id: int | None = col("The study.")
    trial_id: int | None = col("The trial, if any.")
    kind: str = col("What happened, e.g. trial-start, confirmation-confirmed, base-recipe.")
    message: str = col("One line.")


TRIAL_COLUMNS: dict[str, str] = {f.name: f.metadata["doc"] for f in fields(Trial)}


def _write_model(row: type, kept_by_sqlite: tuple[str, ...] = ()) -> type[BaseModel]:
    """The pydantic model a write to ``row``'s table is validated by (an unknown column is an error, and so is one
    that SQLite itself keeps, ``kept_by_sqlite``)."""
    hints = get_type_hints(row)
    columns: dict[str, Any] = {
        f.name: (hints[f.name] | None, None) for f in fields(row) if f.name not in kept_by_sqlite
    }
    return create_model(f"{row.__name__}Write", __config__=ConfigDict(extra="forbid"), **columns)


TRIAL_WRITE, STUDY_WRITE = _write_model(Trial, kept_by_sqlite=("rev",)), _write_model(Study)


def checked(model: type[BaseModel], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` validated against the row's columns (an unknown column or a wrong type is a bug: ValueError),
    JSON columns serialised."""
    try:
        typed = model.model_validate(values)
    except ValidationError as exc:
        raise ValueError(f"ledger write: {validation_line(exc)}") from None
    return {k: jsonify(getattr(typed, k)) for k in values}


def jsonify(v: Any) -> Any:
    """A value as SQLite stores it: dicts and lists as JSON, states as their words."""
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, default=str)
    return _plain(v)


def decode(row: dict[str, Any]) -> Trial:
    """A trial row as SQLite returned it, typed (every read of a trial row passes here)."""
    return Trial.read(row)


def select(db: sqlite_utils.Database, where: str, args: list[Any], study_id: int | None) -> list[Trial]:
    if study_id is not None:
        where, args = f"({where}) AND study_id = ?", args + [study_id]
    return [decode(r) for r in db.table("autorl_trials").rows_where(where, args, order_by="number")]


def insert_event(
    db: sqlite_utils.Database, study_id: int | None, trial_id: int | None, kind: str, message: str
) -> None:
    db.table("autorl_events").insert(
        {"time": time.time(), "study_id": study_id, "trial_id": trial_id, "kind": kind, "message": message}
    )


_STATES: dict[tuple[str, str], Any] = {
    **{
        ("Trial", k): v
        for k, v in {
            "status": TrialStatus,
            "verdict": Verdict,
            "confirmation": Confirmation,
            "proposer": Proposer,
            "crash_category": CrashCategory,
            "crash_action": CrashAction,
            "gate": Gate,
            "kind": Kind,
        }.items()
    },
    ("Study", "status"): StudyStatus,
}
