"""``autorl clean``: remove a finished study's refs and worktrees that nothing needs any more.

A study leaves three refs per trial (branch ``attempt-NN-slug``, tags ``attempt-NN-start`` / ``-end``): a short
study of the default recipe leaves about sixty trials. Once the study has stopped, most of them are only history,
and the ledger keeps that history (values, verdicts, metrics, logs) without them. Kept, with why:

- the baseline's runs: re-validation re-runs the baseline from its start tag, and ``autorl show`` diffs against it;
- every confirmed recipe and the chain of parents it was built on, and every candidate still awaiting confirmation:
  ``autorl promote`` re-runs a recipe from its start tag;
- full runs and the trial each was promoted from: the branch a person adopts.

Removed: the branch and tags of every other trial of the study, and a worktree left behind by a stopped one. Only
names of the shape ``attempt-NN-...`` are deleted (``gitops.ATTEMPT_REF``), never a branch checked out anywhere
(the user's own working tree is never touched), and never while a trial of the study is running: the study's
lock is held while its refs go, so a controller of it (`run --resume`) cannot start meanwhile. The ledger keeps
every row; one ``clean`` event records what went.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autorl import gitops
from autorl.errors import UserError
from autorl.ledger import Ledger, Study, Trial
from autorl.states import Confirmation, Kind, Proposer, StudyStatus
from autorl.workspace import Workspace


@dataclass
class Plan:
    """What cleaning a study removes and keeps."""

    study: str
    remove: list[Trial] = field(default_factory=list)  # ledger rows whose refs go
    keep: dict[int, str] = field(default_factory=dict)  # attempt number -> why it stays
    branches: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    worktrees: list[str] = field(default_factory=list)
    checked_out: list[str] = field(default_factory=list)  # branches kept because a worktree has them checked out

    def as_dict(self) -> dict[str, Any]:
        return {
            "study": self.study,
            "removed_trials": [t.number for t in self.remove],
            "kept": {f"{n:02d}": why for n, why in sorted(self.keep.items())},
            "branches": self.branches,
            "tags": self.tags,
            "worktrees": self.worktrees,
            "checked_out": self.checked_out,
        }


def keep(ledger: Ledger, study_id: int) -> dict[int, str]:
    """The study's trials whose refs stay, with why (the baseline, a confirmed recipe or a candidate and the parents
    it builds on, a full run and the trial it was promoted from)."""
    rows = {t.number: t for t in ledger.trials(study_id)}
    out: dict[int, str] = {t.number: Proposer.BASELINE for t in ledger.baselines(study_id)}
    for t in rows.values():
        if t.confirmation in (Confirmation.CONFIRMED, Confirmation.CANDIDATE):
            for n in _ancestors(rows, t.number):
                confirmed = rows[n].confirmation == Confirmation.CONFIRMED
                out.setdefault(n, Confirmation.CONFIRMED if confirmed else Confirmation.CANDIDATE)
        if t.kind == Kind.FULL:
            out[t.number] = "full run"
            if t.promoted_from is not None:
                out.setdefault(t.promoted_from, "promoted")
    return out


def _ancestors(rows: dict[int, Trial], number: int) -> list[int]:
    out: list[int] = []
    at: int | None = number
    while at is not None and at in rows and at not in out:
        out.append(at)
        at = rows[at].parent
    return out


def plan(ws: Workspace, ledger: Ledger, study: str | None = None) -> Plan:
    """What ``clean`` would do to the study (the latest by default); refuses a study that is still running."""
    st = ledger.study(study)
    running = [t.attempt for t in ledger.unfinished() if t.study_id == st.id]
    if st.status == StudyStatus.RUNNING or running:
        what = f"{running[0]} is still running" if running else "it has not stopped"
        raise UserError(f"study {st.name} cannot be cleaned yet: {what}; clean it once it has stopped")
    p = Plan(st.name, keep=keep(ledger, st.id))
    existing, busy = gitops.refs(ws.root), gitops.checked_out_branches(ws.root)
    for t in ledger.trials(st.id):
        if t.number in p.keep:
            continue
        p.remove.append(t)
        branch = t.branch
        if branch in busy:
            p.checked_out.append(branch)
        elif branch in existing:
            p.branches.append(branch)
        p.tags += [tag for tag in (t.start_tag, t.end_tag) if tag in existing]
        if (ws.worktrees / t.attempt).exists() and branch not in busy:
            p.worktrees.append(t.attempt)
    return p


def clean(ws: Workspace, ledger: Ledger, study: str | None = None, dry_run: bool = False) -> Plan:
    """Remove what ``plan`` lists (nothing with ``dry_run``); one ledger event says what went."""
    if dry_run:
        return plan(ws, ledger, study)
    st = ledger.study(study)
    lock = ws.lock_study(st.name)  # a `run --resume` of it cannot start while its refs go (nor clean while it runs)
    try:
        p = plan(ws, ledger, st.name)
        if p.branches or p.tags or p.worktrees:
            _remove(ws, ledger, st, p)
        return p
    finally:
        lock.release()


def _remove(ws: Workspace, ledger: Ledger, st: Study, p: Plan) -> None:
    for name in p.worktrees:
        gitops.remove_worktree(ws.root, ws.worktrees / name)
    gitops.delete_attempt_refs(ws.root, p.branches, p.tags)
    ledger.event(
        st.id,
        None,
        "clean",
        f"removed {len(p.branches)} branches, {len(p.tags)} tags and "
        f"{len(p.worktrees)} worktrees of {len(p.remove)} trials",
    )
