"""A promoted full run that ended without a record, started over: ``autorl promote --resume``.

A full run's monitor is a process of the machine it runs on. When that machine goes (a GPU host given back, a node
lost, a reboot), the ledger row stays ``running`` with nobody to close it. ``relaunch`` finds the study's latest
such row (its monitor pid no longer alive here), marks it ``interrupted`` with the time it last wrote, and opens a
new full-run attempt from the lost one's start tag (the same full-length recipe, committed as it was), carrying the
re-validation and hack gate the lost one recorded: the evidence does not go with the machine, so it is not run
again. The new row's ``retry_of`` names the lost one; the run starts from its first step (a full run saves no
optimizer state to go on from).
"""

from __future__ import annotations

from typing import Any

from autorl.errors import NotFoundError, UserError
from autorl.ledger import Ledger, Trial
from autorl.promote.promotion import spawn_full_run
from autorl.promote.source import trial_recipe
from autorl.runs.lifecycle import open_attempt
from autorl.runs.watch import last_seen
from autorl.states import Kind, Proposer, TrialStatus
from autorl.workspace import Workspace


def lost_full_run(ws: Workspace, ledger: Ledger, study: str | None = None, number: int | None = None) -> Trial:
    """The full run to start over: ``number``, or the study's latest ``running`` full run whose monitor is gone."""
    if number is not None:
        row = ledger.trial(number)
        if row.kind != Kind.FULL:
            raise UserError(f"{row.attempt} is not a full run: `autorl promote --resume` starts a lost full run over")
        rows = [row]
    else:
        st = ledger.study(study)
        rows = [t for t in ledger.trials(st.id, kind=Kind.FULL) if t.status == TrialStatus.RUNNING]
        if not rows:
            raise NotFoundError(
                f"no full run of study {st.name} stopped without an end: nothing to resume "
                "(`autorl status` says what ran)"
            )
    row = rows[-1]
    if row.status != TrialStatus.RUNNING:
        raise UserError(f"{row.attempt} ended ({row.status}): only a full run left running without a monitor resumes")
    host = ws.monitor_elsewhere(row.number)
    if host is not None:
        raise UserError(
            f"{row.attempt}'s monitor runs on {host}, which cannot be checked from here: run `autorl promote --resume` "
            f"there, or, if {host} is gone, remove {ws.shown(ws.runs)}/fullrun-{row.number:02d}.monitor.json first"
        )
    if ws.monitor_alive(row.number, row.pid):
        raise UserError(f"{row.attempt} is running (pid {row.pid}): follow it with `autorl status`")
    check_start(ws, ledger, row)
    return row


def check_start(ws: Workspace, ledger: Ledger, row: Trial) -> None:
    """The recipe at the lost run's start tag must be its source trial's, as that trial ran (the values the ledger
    recorded), with the full run's own values: a start tag rebuilt or moved by hand could otherwise spend a whole
    full run on a recipe nobody re-validated."""
    if row.promoted_from is None:
        return
    source = ledger.trial(row.promoted_from)
    recipe, _, _ = trial_recipe(ws, ledger, row)
    own = row.changed or {}
    for key, value in (source.params or {}).items():
        if key not in own and recipe.train.get(key) != value:
            raise UserError(
                f"{row.start_tag} does not hold {source.attempt}'s recipe: {key} is {recipe.train.get(key)!r} there, "
                f"{value!r} in the run that was re-validated; restore the tag (git tag -f {row.start_tag} ...) or "
                f"promote {source.number:02d} afresh (`autorl promote {source.number}`)"
            )


def relaunch(ws: Workspace, ledger: Ledger, study: str | None = None, number: int | None = None) -> dict[str, Any]:
    """Mark the lost full run interrupted and launch its recipe again as a new attempt; what was launched."""
    row = lost_full_run(ws, ledger, study, number)
    lock = ws.lock_promote(f"resume of {row.attempt}")
    try:
        ledger = Ledger(ws.ledger_path)  # the checks passed, the lock held: from here on it records
        seen = last_seen(row.log_path, row.started)
        why = f"its monitor (pid {row.pid}) was gone: the run ended without a record"
        ledger.update_trial(
            row.id,
            status=TrialStatus.INTERRUPTED,
            finished=seen,
            duration_s=None if seen is None or row.started is None else round(seen - row.started, 2),
            reason=why,
            event="full-run-lost",
        )
        assert row.start_tag is not None  # every attempt is tagged where it starts
        a = open_attempt(
            ws,
            ledger,
            rev=row.start_tag,
            slug=row.attempt.split("-", 2)[-1],
            files={},
            message=f"{row.attempt} started over ({why}); re-validation as recorded there",
            study_id=row.study_id,
            proposer=Proposer.PROMOTE,
            hypothesis=row.hypothesis,
            kind=Kind.FULL,
            promoted_from=row.promoted_from,
            retry_of=row.number,
            why=f"{row.attempt} started over: {why}; {row.why or ''}".strip("; "),
            changed=row.changed,
            delta=row.delta,
            ci_low=row.ci_low,
            ci_high=row.ci_high,
            method=row.method,
            n_items=row.n_items,
            gate=row.gate,
            gate_checks=row.gate_checks,
        )
        pid = spawn_full_run(ws, a.number)
        ledger.update_trial(a.row_id, event="full-run-launched", pid=pid, reason=f"monitor pid {pid}")
    finally:
        lock.release()
    return {
        "attempt": a.name,
        "number": a.number,
        "resumed": row.attempt,
        "promoted_from": row.promoted_from,
        "monitor_pid": pid,
    }
