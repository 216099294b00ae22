"""The rows of the ledger's tables: each column's type and meaning, the check every write passes, the
decoding of JSON columns, and the two statements every part of the ledger shares (a study's trials, an event)."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, TypedDict, get_type_hints

import sqlite_utils
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from autorl.errors import validation_line


class TrialRow(TypedDict, total=False):
    """One row of ``autorl_trials`` as the ledger writes and reads it: each column's type and meaning (docs/ledger.md
    is generated from this table). Writes are validated against it; JSON columns come back decoded."""

    id: Annotated[int | None, "Row id."]
    study_id: Annotated[int | None, "The study this trial belongs to."]
    number: Annotated[int | None, "Attempt number NN (unique per workspace)."]
    attempt: Annotated[str | None, "Attempt name = branch, e.g. attempt-07-lr-3e-4."]
    branch: Annotated[str | None, "Git branch of the trial."]
    start_tag: Annotated[str | None, "Tag on the commit the trial ran (attempt-NN-start)."]
    end_tag: Annotated[str | None, "Tag on the commit with its results (attempt-NN-end)."]
    start_sha: Annotated[str | None, "Commit SHA the trial ran."]
    end_sha: Annotated[str | None, "Commit SHA with the results file and research-log entry."]
    proposer: Annotated[
        str | None,
        "Who proposed it: baseline, optuna, random, hypothesis (ranked), move (a "
        "direction-aware move rule, autorl/data/rules/moves.yaml), confirm, retry, promote.",
    ]
    hypothesis: Annotated[str | None, "Hypothesis id tested (NULL for plain search)."]
    why: Annotated[str | None, "Why it was chosen (the diagnosis that led there)."]
    params: Annotated[dict[str, Any] | None, "JSON of the full train block run."]
    changed: Annotated[dict[str, Any] | None, "JSON of the values that differ from the baseline recipe."]
    seed: Annotated[int | None, "Seed the trial ran with."]
    optuna_number: Annotated[int | None, "Optuna trial number (join key with Optuna's tables)."]
    status: Annotated[str | None, "running, complete, pruned, crash, budget-cut, interrupted, timeout, config-error."]
    verdict: Annotated[str | None, "improved, regressed, flat, crash, pruned (NULL while running or for a baseline)."]
    reason: Annotated[str | None, "One line: why this status/verdict."]
    objective: Annotated[float | None, "Objective value (NULL for a crash; never a placeholder)."]
    delta: Annotated[float | None, "Gain over the trial's parent (the recipe it modifies), better-is-positive."]
    gap_to_best: Annotated[
        float | None,
        "Objective minus the best objective of the study's earlier trials (the incumbent), better-is-positive.",
    ]
    ci_low: Annotated[float | None, "Lower end of the interval for delta."]
    ci_high: Annotated[float | None, "Upper end of the interval for delta."]
    parent: Annotated[int | None, "Attempt number of the parent the trial was judged against (NULL = the baseline)."]
    gain_vs_baseline: Annotated[
        float | None, "Gain over the study's original baseline, reported apart from the verdict."
    ]
    confirmation: Annotated[
        str | None,
        "For an improved trial: candidate, confirmed or rejected (fresh-seed re-runs "
        "decide), or suspect (confirmed, but the hack gate failed: see gate_checks).",
    ]
    confirms: Annotated[int | None, "Attempt number of the candidate this confirmation run re-runs."]
    method: Annotated[str | None, "How the interval was computed."]
    n_items: Annotated[int | None, "Eval items (or repeats) behind the interval."]
    flags: Annotated[list[dict[str, Any]] | None, "JSON list of flags with evidence (divergence, truncation, ...)."]
    crash_category: Annotated[str | None, "Triage category of a crash."]
    crash_action: Annotated[
        str | None,
        "What triage decided for a crash: retry_reduced, retry_once, record or stop "
        "(a retry not yet run when the controller stopped is queued again on resume).",
    ]
    crash_signature: Annotated[str | None, "Stable signature grouping identical failures."]
    root_cause: Annotated[str | None, "The log line a person would point at."]
    remedy: Annotated[str | None, "What to do about the crash."]
    test: Annotated[
        str | None, "The test behind the verdict: what it compares, the t distribution's df and the interval's level."
    ]
    trial_sd: Annotated[
        float | None,
        "Run-to-run sd the verdict assumed for the trial's recipe (never below the "
        "parent's; larger where the trial's own runs or the study's other changed recipes showed "
        "more).",
    ]
    parent_sd: Annotated[
        float | None, "Run-to-run sd the verdict assumed for the parent's recipe (its replicate runs with the prior)."
    ]
    fp_rate: Annotated[
        float | None,
        "Calibrated false-positive rate of the verdict: the share of no-effect trials its "
        "test calls what it called this one (improved or regressed; flat: either), simulated at the "
        "noise it assumed.",
    ]
    confirm_test: Annotated[str | None, "The test behind a candidate's confirmation (its fresh-seed runs)."]
    confirm_trial_sd: Annotated[float | None, "Run-to-run sd the confirmation assumed for the candidate's recipe."]
    confirm_parent_sd: Annotated[float | None, "Run-to-run sd the confirmation assumed for the parent's recipe."]
    confirm_fp_rate: Annotated[
        float | None,
        "Calibrated false-positive rate of the confirmation: the share of "
        "no-effect candidates its test confirms (rejected: the same share), at the noise it "
        "assumed.",
    ]
    gate: Annotated[
        str | None,
        "The hack gate at confirmation (and on a full run, at promote): ok, suspect (a check "
        "failed) or blind (no held-out task metric to check against).",
    ]
    gate_checks: Annotated[
        list[dict[str, Any]] | None,
        "JSON list of the hack gate's checks: name, ok "
        "(true/false/null = not measured), detail and the numbers behind it.",
    ]
    retry_of: Annotated[int | None, "Attempt number of the crashed trial this retries."]
    promoted_from: Annotated[int | None, "Attempt number a full run was promoted from."]
    kind: Annotated[str | None, "trial or full."]
    started: Annotated[float | None, "Unix time the trial started."]
    finished: Annotated[float | None, "Unix time it ended."]
    duration_s: Annotated[float | None, "Wall seconds."]
    first_step: Annotated[
        float | None,
        "Unix time the trial's first training step was logged: what came before it "
        "(process and job start-up, model load) does not grow with the trial's work.",
    ]
    log_path: Annotated[str | None, "The run's log file."]
    metrics_path: Annotated[str | None, "The run's metrics JSONL."]
    exit_code: Annotated[int | None, "Exit code of the run (NULL if it never exited)."]
    pid: Annotated[int | None, "Process group of the running trial (for cleanup on resume)."]
    job_id: Annotated[str | None, "Ray job id of the running trial (for cleanup on resume)."]
    job_address: Annotated[str | None, "Ray dashboard address the job was submitted to."]
    rev: Annotated[
        int | None,
        "Revision: set by the ledger's triggers on every insert and update of the row, higher "
        "than any revision before it, so a running study re-reads only the rows that changed (never "
        "written by autorl's code).",
    ]


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


JSON_COLUMNS = ("params", "changed", "flags", "base_changes", "gate_checks")


def _write_model(row: type, kept_by_sqlite: tuple[str, ...] = ()) -> type[BaseModel]:
    """The pydantic model a write to ``row``'s table is validated by (an unknown column is an error, and so is one
    that SQLite itself keeps, ``kept_by_sqlite``)."""
    fields = {k: (h, None) for k, h in get_type_hints(row).items() if k not in kept_by_sqlite}
    return create_model(f"{row.__name__}Write", __config__=ConfigDict(extra="forbid"), **fields)


TRIAL_WRITE, STUDY_WRITE = _write_model(TrialRow, kept_by_sqlite=("rev",)), _write_model(StudyRow)


# A run the controller stopped (Ctrl-C, a kill recovered on resume, the budget's end) did not reach its own end:
# a confirmation or retry stopped that way is run again on resume.
STOPPED_EARLY = ("interrupted", "budget-cut")


def checked(model: type[BaseModel], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` validated against the row's columns (an unknown column or a wrong type is a bug: ValueError),
    JSON columns serialised."""
    try:
        typed = model.model_validate(values)
    except ValidationError as exc:
        raise ValueError(f"ledger write: {validation_line(exc)}") from None
    return {k: jsonify(getattr(typed, k)) for k in values}


def jsonify(v: Any) -> Any:
    return json.dumps(v, sort_keys=True, default=str) if isinstance(v, (dict, list)) else v


def decode(row: dict) -> Any:
    out = dict(row)
    for key in JSON_COLUMNS:
        if isinstance(out.get(key), str):
            try:
                out[key] = json.loads(out[key])
            except json.JSONDecodeError:
                pass
    return out


def select(db: sqlite_utils.Database, where: str, args: list, study_id: int | None) -> list[TrialRow]:
    if study_id is not None:
        where, args = f"({where}) AND study_id = ?", args + [study_id]
    return [decode(r) for r in db["autorl_trials"].rows_where(where, args, order_by="number")]


def insert_event(
    db: sqlite_utils.Database, study_id: int | None, trial_id: int | None, kind: str, message: str
) -> None:
    db["autorl_events"].insert(
        {"time": time.time(), "study_id": study_id, "trial_id": trial_id, "kind": kind, "message": message}
    )
