"""The base recipe's carry: what the recipe as written needed to run at all.

After the baseline ran out of memory and its retry with a smaller value completed, every later trial (and baseline
repeat) starts from that value. The carry is derived from the ledger's rows and kept on the study
(``base_changes``), so a resumed study, or one stopped between the retry's end and this record, carries it too.
"""

from __future__ import annotations

from typing import Any

from autorl.judge.result import TrialResult
from autorl.ledger import Trial
from autorl.recipe import dump_values, recipe_from_text, set_train_values
from autorl.search.proposal import Proposal
from autorl.states import Proposer, TrialStatus
from autorl.study.state import StudyState


def carry_base(s: StudyState) -> None:
    """Build trials from the recipe as written plus what its completed reduced baseline retries changed."""
    changes: dict[str, Any] = {}
    lines: list[str] = []
    for row in s.records.baselines():
        carried, line = carried_by(s, row)
        changes.update(carried)
        lines += [line] if carried else []
    if not changes:
        return
    if changes != (s.row.base_changes or {}):
        s.records.set_base_changes(changes, lines[-1])
        s.row = s.ledger.study(study_id=s.id)
    assert s.row.recipe is not None  # a study keeps the recipe text it was made with
    text = set_train_values(s.row.recipe, changes)
    s.rebase(recipe_from_text(text, s.recipe_rel), text)


def carried_by(s: StudyState, row: Trial) -> tuple[dict[str, Any], str]:
    """What a completed retry of a crashed baseline changed against it (nothing for any other row), and the line
    that says so."""
    if row.proposer != Proposer.RETRY or row.status != TrialStatus.COMPLETE or row.retry_of is None:
        return {}, ""
    crashed = s.records.trial(row.retry_of)
    before = crashed.params or {}
    changes = {k: v for k, v in (row.params or {}).items() if k != "seed" and before.get(k) != v}
    if not changes:  # a retry with the same values (a transient crash) changes nothing
        return {}, ""
    line = (
        f"the study's base recipe now has {dump_values(changes)} instead of "
        f"{dump_values({k: before.get(k) for k in changes})}: {crashed.attempt} crashed "
        f"({crashed.crash_category}) and {row.attempt}, its reduced retry, completed; "
        "later trials and baseline repeats start from it"
    )
    return changes, line


def carry_note(s: StudyState, proposal: Proposal, number: int, result: TrialResult) -> str:
    """The line a completed reduced retry of the baseline adds to its own reason ('' for any other trial)."""
    if result.status != TrialStatus.COMPLETE or proposal.retry_of is None or not s.proposer.is_baseline(proposal):
        return ""
    row = s.records.trial(number).replace(status=TrialStatus.COMPLETE)  # its row still says running
    return carried_by(s, row)[1]
