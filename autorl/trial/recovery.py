"""What a stopped study leaves behind, and what a resumed one picks up.

- ``recover``: after a kill, runs left marked running are stopped (their process group or Ray job), marked
  interrupted, their worktrees removed, and the Optuna trials left RUNNING told FAIL;
- ``requeue``: on ``--resume``, candidates whose confirmation runs all ended are judged, then the confirmation
  runs and crash retries the stopped study had queued but not run go first (``autorl.search.queue``);
- ``release_unstarted``: when a study stops, proposals drawn but never started are logged and their Optuna
  trials told FAIL, their values enqueued again so that a resumed study proposes them first.
"""

from __future__ import annotations

import time

from autorl import gitops
from autorl.backends.base import kill_group
from autorl.trial import judging
from autorl.trial.slots import stop_job
from autorl.trial.state import StudyState


def recover(s: StudyState) -> None:
    """After a kill: stop orphaned runs, mark their trials interrupted, clean worktrees, fail Optuna's leftovers."""
    for row in s.records.trials(status="running"):
        if row.get("pid"):
            kill_group(int(row["pid"]), grace_s=2.0)
        if row.get("job_id") and row.get("job_address"):
            stop_job(row["job_address"], row["job_id"])
        s.ledger.update_trial(row["id"], event="recovered", status="interrupted", finished=time.time(),
                              reason="the controller stopped during this trial; recovered on resume")
        gitops.remove_worktree(s.ws.root, s.ws.worktrees / row["attempt"])
    s.proposer.recover()


def requeue(s: StudyState) -> None:
    """On resume: judge candidates whose confirmation runs all ended, then queue again the confirmations and
    crash retries the stopped controller had queued but not run (they run before anything new)."""
    for row in s.records.open_candidates():
        judging.confirm(s, row["number"])
    queued = s.proposer.queue.requeue()
    if queued:
        line = (f"resume: {len(queued)} queued run(s) the stopped study had not run go first: "
                + ", ".join(p.slug for p in queued))
        s.records.event(None, "requeued", line)
        s.view.line(line)


def release_unstarted(s: StudyState) -> None:
    """Proposals drawn but never started are not trials: each is logged, and its Optuna trial (if any) is told
    FAIL rather than left RUNNING, with its values enqueued again so that a resumed study proposes them first."""
    for p in s.proposer.pending:
        note = "; `autorl run --resume` runs it first" if p.proposer in ("confirm", "retry") else ""
        if p.optuna_study is not None and p.optuna_number is not None:
            note = s.proposer.search(p.optuna_study).release(p.optuna_number, again=p.proposer != "baseline")
        s.records.event(None, "not-started", f"{p.proposer} proposal {p.slug} not started when the study stopped{note}")
    s.proposer.pending.clear()
