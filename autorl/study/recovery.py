"""What a stopped study leaves behind, and what a resumed one picks up.

- ``recover``: after a kill, runs left marked running are stopped (their process group or Ray job), marked
  interrupted, their worktrees removed, and the Optuna trials left RUNNING told FAIL;
- ``requeue``: on ``--resume``, candidates whose confirmation runs all ended are judged, then the confirmation
  runs and crash retries the stopped study had queued but not run go first (``autorl.search.queue``);
- ``release_unstarted``: when a study stops, proposals drawn but never started are logged and their Optuna
  trials told FAIL, their values enqueued again so that a resumed study proposes them first;
- ``LedgerWatch``: at every turn of the loop, the ledger is still the file the study opened; now and then (at most
  2 % of the time), every page of it reads;
- ``stop_error``: what ended a study, as the one line to tell (a full disk, a lost or damaged ledger, whichever
  library met it first);
- ``shut_down``: however a study ends, what still runs is stopped and the study closed, each step on its own so that
  none hides the error that ended it; after a lost ledger or a full disk nothing more is written anywhere.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Iterator
from typing import Any

from autorl import gitops
from autorl.backends.base import kill_group
from autorl.errors import DiskFullError, LedgerError, WorkspaceError, short
from autorl.ledger import Ledger, disk_full, free_bytes, ledger_error
from autorl.runs.slots import Slots, stop_job
from autorl.runs.watch import last_seen
from autorl.states import Proposer, StudyStatus, TrialStatus
from autorl.study import judging
from autorl.study.state import Running, StudyState


def recover(s: StudyState) -> None:
    """After a kill: stop orphaned runs, mark their trials interrupted, clean worktrees, fail Optuna's leftovers."""
    for row in s.records.trials(status=TrialStatus.RUNNING):
        if row.pid:
            kill_group(int(row.pid), grace_s=2.0)
        if row.job_id and row.job_address:
            stop_job(row.job_address, row.job_id)
        seen = last_seen(row.log_path, row.started)
        s.ledger.update_trial(
            row.id,
            event="recovered",
            status=TrialStatus.INTERRUPTED,
            finished=seen if seen is not None else time.time(),
            duration_s=None if seen is None or row.started is None else round(seen - row.started, 2),
            reason="the controller stopped during this trial; recovered on resume",
        )
        gitops.remove_worktree(s.ws.root, s.ws.worktrees / row.attempt)
    s.proposer.recover()


def requeue(s: StudyState) -> None:
    """On resume: judge candidates whose confirmation runs all ended, then queue again the confirmations and
    crash retries the stopped controller had queued but not run (they run before anything new)."""
    for row in s.records.open_candidates():
        judging.confirm(s, row.number)
    queued = s.proposer.queue.requeue()
    if queued:
        line = f"resume: {len(queued)} queued run(s) the stopped study had not run go first: " + ", ".join(
            p.slug for p in queued
        )
        s.records.event(None, "requeued", line)
        s.view.line(line)


def release_unstarted(s: StudyState) -> None:
    """Proposals drawn but never started are not trials: each is logged, and its Optuna trial (if any) is told
    FAIL rather than left RUNNING, with its values enqueued again so that a resumed study proposes them first."""
    for p in s.proposer.pending:
        note = "; `autorl run --resume` runs it first" if p.proposer in (Proposer.CONFIRM, Proposer.RETRY) else ""
        if p.optuna_study is not None and p.optuna_number is not None:
            again = p.proposer != Proposer.BASELINE
            note = s.proposer.search(p.optuna_study).release(p.optuna_number, again=again)
        s.records.event(None, "not-started", f"{p.proposer} proposal {p.slug} not started when the study stopped{note}")
    s.proposer.pending.clear()


class LedgerWatch:
    """The loop's look at its ledger: ``step()`` checks the file is the one opened (a ``stat``), and runs SQLite's
    ``quick_check`` of every page when one is due: ``floor_s`` after the last, or longer so that checks take at
    most ``share`` of the time."""

    def __init__(self, ledger: Ledger, share: float = 0.02, floor_s: float = 2.0):
        self.ledger, self.share, self.floor_s = ledger, share, floor_s
        self.due = time.monotonic() + floor_s

    def step(self) -> None:
        self.ledger.file.check()
        if time.monotonic() >= self.due:
            cost = self.ledger.file.verify(self.ledger.db)
            self.due = time.monotonic() + max(self.floor_s, cost / self.share)


_NO_SPACE = ("no space left on device", "database or disk is full", "disk quota exceeded")


def stop_error(s: StudyState, exc: BaseException) -> BaseException:
    """The error to tell for ``exc``: a full disk or a lost, replaced or damaged ledger as its one line (whichever
    of git, SQLite, Optuna or the file system met it first), else ``exc`` itself."""
    if isinstance(exc, (LedgerError, DiskFullError)):
        return exc
    try:
        s.ledger.file.check()
    except LedgerError as lost:
        return lost
    chain = list(_chain(exc))
    if any(_no_space(e) for e in chain):
        path = s.ledger.path if free_bytes(s.ledger.path) < free_bytes(s.ws.root) else s.ws.root
        return disk_full(path)
    sqlite = next((e for e in chain if e.__class__.__module__.startswith("sqlite3")), None)
    if sqlite is not None:
        return ledger_error(s.ledger.path, sqlite)
    path_error = next((e for e in chain if isinstance(e, OSError) and e.filename), None)
    if path_error is not None:  # a path autorl writes is in the way, or not allowed: the environment, not a bug
        return WorkspaceError(
            f"{short(path_error.filename, 200)}: {path_error.strerror}: the study stopped; fix that "
            "path (a file in the way, permissions), then `autorl run --resume`"
        )
    return exc


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        orig = getattr(exc, "orig", None)  # SQLAlchemy's wrapper of the driver's error (Optuna's storage)
        if isinstance(orig, BaseException):
            yield orig
        exc = exc.__cause__ or exc.__context__


def _no_space(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return any(needle in str(exc).lower() for needle in _NO_SPACE)


def shut_down(s: StudyState, running: Running, slots: Slots | None, failure: BaseException | None) -> None:
    """Stop the trials still running, close the backend and the slots, mark the study stopped (with the failure's
    reason), release its lock. Each step runs whatever the others do; none raises. After a lost ledger or a full
    disk, nothing is written: a resume once the ledger is back or space is freed recovers the trials."""
    writable = not isinstance(failure, (LedgerError, DiskFullError))
    steps: list[Callable[[], Any]] = [lambda: _stop_running(s, running, writable), s.backend.close]
    if slots is not None:
        steps.append(slots.close)
    if writable:
        steps.append(lambda: _mark_stopped(s, failure))
    if isinstance(failure, LedgerError) and s.ledger.file.identity != _identity_now(s.ledger):
        steps.append(lambda: s.ledger.close(lost=True))
    steps += [s.view.close, lambda: s.lock.release() if s.lock else None]
    for step in steps:
        try:
            step()
        except Exception:  # noqa: BLE001 - clean-up never hides the error that ended the study
            pass


def _stop_running(s: StudyState, running: Running, writable: bool) -> None:
    """Kill the trials in flight (their process groups or Ray jobs); record them interrupted where the ledger and
    git can still be written."""
    for _ctx, watch in list(running.values()):
        try:
            watch.handle.cancel(grace_s=2.0)
        except Exception:  # noqa: BLE001 - the next trial is stopped whatever this one did
            pass
    for ctx, _ in list(running.values()) if writable else []:
        s.ledger.update_trial(
            ctx.attempt.row_id,
            event="interrupted",
            status=TrialStatus.INTERRUPTED,
            finished=time.time(),
            reason="the study stopped on an error during this trial",
            pid=None,
        )
        gitops.remove_worktree(s.ws.root, ctx.attempt.worktree)
    running.clear()


def _mark_stopped(s: StudyState, failure: BaseException | None) -> None:
    s.ledger.update_study(s.id, status=StudyStatus.STOPPED)
    if failure is not None:
        s.ledger.event(s.id, None, "study-stopped", f"{failure.__class__.__name__}: {str(failure)[:300]}")


def _identity_now(ledger: Ledger) -> Any:
    try:
        ledger.file.check()
    except LedgerError:
        return None
    return ledger.file.identity
