"""A crashed trial: its diagnosis, the action triage decides (``autorl.judge.triage``, rules in crash_rules.yaml),
and that action carried out: recorded as an event and shown, a retry queued by the proposer, a stop ending the study.
"""

from __future__ import annotations

from typing import Any

from autorl.judge import triage
from autorl.judge.result import TrialResult
from autorl.runs.watch import Outcome, Stop
from autorl.search.proposal import Proposal
from autorl.states import CrashAction, TrialStatus, Verdict
from autorl.study.state import StudyState, TrialContext
from autorl.workspace import Workspace

CRASH_STOP = "crash-stop"  # how a study that triage stopped ended (`autorl run` exits 1, not 130)
RETRIES = (CrashAction.RETRY_REDUCED, CrashAction.RETRY_ONCE)
# what the watchdog that ended a run tells triage
WATCHDOG = {TrialStatus.HANG: "silence", TrialStatus.TIMEOUT: "timeout"}


def diagnose(ctx: TrialContext, outcome: Outcome, nonfinite: str | None, ws: Workspace) -> dict[str, Any]:
    """The triage columns of a crashed (or NaN-stopped) trial, from its log and how the controller saw it end, with
    the workspace's own families (the user's `autorl triage label` corrections) beside the shipped ones."""
    log = train_log(ctx)
    watchdog = WATCHDOG.get(outcome.status)
    local = ws.run_dir / triage.LOCAL_FAMILIES
    d = triage.classify(log, exit_code=outcome.exit_code, watchdog=watchdog, metrics_nonfinite=nonfinite, local=local)
    return {
        "crash_category": d.category,
        "crash_signature": d.signature,
        "root_cause": d.root_cause_line,
        "remedy": d.remedy,
        "reason": outcome.reason or f"{d.category}: {d.root_cause_line[:120]}",
    }


def decide(s: StudyState, ctx: TrialContext, r: TrialResult) -> triage.Action | None:
    """What to do about a crashed trial (``triage.decide_action``); None for any other result."""
    if r.verdict != Verdict.CRASH or not r.crash_category:
        return None
    d = triage.CrashReport(
        category=r.crash_category,
        root_cause_line=r.root_cause or "",
        remedy=r.remedy or "",
        signature=r.crash_signature or "",
    )
    earlier = s.records.trials(verdict=Verdict.CRASH, crash_signature=d.signature)
    p = ctx.proposal
    return triage.decide_action(
        d,
        is_baseline=s.proposer.is_baseline(p),
        retries_so_far=int(p.retry_of is not None),
        signature_count=len(earlier) + 1,
        run_dir=ctx.attempt.run_dir,
        log_text=train_log(ctx),
    )


def act(s: StudyState, ctx: TrialContext, action: triage.Action) -> Stop | None:
    """Record what was done and why (ledger event, live view); a stop is returned for the loop to end the study (the
    trials still running then are interrupted)."""
    reason = action.reason + baseline_note(s, ctx.proposal, action)
    line = f"{ctx.attempt.name}: {action.kind}: {reason}"
    s.records.event(ctx.attempt.row_id, "crash-action", line)
    s.view.line(line)
    if action.kind != CrashAction.STOP:
        return None
    return Stop(TrialStatus.INTERRUPTED, f"{ctx.attempt.name}: {action.reason}")


def baseline_note(s: StudyState, p: Proposal, action: triage.Action) -> str:
    """What a crash of the baseline means for the study: retried first, else the end of it."""
    if not s.proposer.is_baseline(p) or action.kind == CrashAction.STOP:
        return ""
    if action.kind in RETRIES and s.proposer.baseline_retry_queued():
        return "; the baseline is retried before the study goes on"
    if not s.proposer.baseline_failed():  # lost to what its values cannot cause
        return "; not the recipe's doing: " + (
            "a baseline run with a fresh seed takes its place"
            if s.proposer.baseline_runs_missing()
            else "the baseline is known"
        )
    return "; the baseline failed, so the study ends here"


def train_log(ctx: TrialContext) -> str:
    """The trial's log ('' when there is none)."""
    try:
        return triage.read_tail(ctx.attempt.run_dir / "train.log")
    except OSError:
        return ""
