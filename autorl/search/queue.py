"""The runs queued in front of the strategy: a candidate's fresh-seed confirmation runs and a crash's retry.

``RunQueue.pending`` is taken first by the proposer. A confirmation run re-runs a candidate's values with a fresh
seed; a retry re-runs a crashed trial as triage's action says (``retry_once``: unchanged, ``retry_reduced``: with
its backend's ``oom_retry`` reduction). On resume, ``requeue`` rebuilds from the ledger what a stopped study had
queued but not run.
"""

from __future__ import annotations

from collections.abc import Callable

from autorl.backends.base import Backend
from autorl.judge import triage
from autorl.ledger import StudyRecords, Trial
from autorl.recipe import dump_values
from autorl.search.proposal import Proposal
from autorl.search.strategies import Strategy
from autorl.search.view import StudyView
from autorl.states import CrashAction, CrashCategory, Proposer, TrialStatus


class RunQueue:
    """Confirmation runs and crash retries waiting to run, oldest first (``records``: the study's ledger rows)."""

    def __init__(self, records: StudyRecords, view: StudyView, backend: Backend, strategy: Strategy):
        self.records, self.view, self.backend, self.strategy = records, view, backend, strategy
        self.pending: list[Proposal] = []

    def crash_retry(self, p: Proposal, number: int, category: CrashCategory | None, action: CrashAction | None) -> None:
        """Queue the retry triage's ``action`` asks for (nothing for record or stop)."""
        if action == CrashAction.RETRY_REDUCED:
            self._reduced_retry(p, number)
        elif action == CrashAction.RETRY_ONCE:
            self._same_retry(p, number, category)

    def _reduced_retry(self, p: Proposal, number: int) -> None:
        params = {**self.view.base.train, **p.values}
        reduced = self.backend.oom_retry(params, changed=tuple(p.values))
        if not reduced:
            return
        values = {**p.values, **reduced}
        why = (
            f"retry of an out-of-memory crash with {dump_values(reduced)} (the most recent memory-expanding "
            "change reduced)"
        )
        retry = Proposal(
            Proposer.RETRY,
            values,
            why,
            "oom-retry-" + dump_values(reduced),
            hypothesis=p.hypothesis,
            retry_of=number,
            patch=p.patch,
            parent=p.parent,
        )
        self.pending.append(retry)

    def _same_retry(self, p: Proposal, number: int, category: CrashCategory | None) -> None:
        """The same values once more: a hang, timeout, network error or external kill may not recur."""
        why = f"retry of a {category} crash with the same values (it may be transient)"
        self.pending.append(
            Proposal(
                Proposer.RETRY,
                dict(p.values),
                why,
                "retry-" + (dump_values(p.values) or "baseline"),
                hypothesis=p.hypothesis,
                retry_of=number,
                patch=p.patch,
                parent=p.parent,
            )
        )

    def confirmation_runs(self, p: Proposal, number: int, runs: int) -> None:
        """Re-run candidate ``number`` with ``runs`` fresh seeds, before anything but the confirmation runs already
        waiting, except those of a weaker candidate none of whose runs has started (``_confirm_slot``). With trials
        in parallel, candidates are judged while others' confirmations run: a newer candidate's runs put in front
        of a started one would take every slot that frees, and a study whose budget ends then leaves each candidate
        a run short of confirmed (seen on a 4-GPU host: three candidates, one run each)."""
        at = self._confirm_slot(number, runs)
        self.pending[at:at] = [self._confirmation(p, number, k, runs) for k in range(runs)]

    def _confirm_slot(self, number: int, runs: int) -> int:
        """Where candidate ``number``'s runs go: before the first waiting candidate that is weaker (a lower bound
        of its gain below this one's) and has no run started, else after the last waiting confirmation run. A
        budget that ends mid-queue then leaves the weaker candidates unconfirmed, not the one the user would
        promote (seen on a real study: the weakest of four candidates was judged first and queued first)."""
        mine = self._lower_bound(number)
        waiting = [q.confirms for q in self.pending if q.proposer == Proposer.CONFIRM]
        opened = {r.confirms for r in self.records.trials(proposer=Proposer.CONFIRM)}
        for i, q in enumerate(self.pending):
            if q.proposer != Proposer.CONFIRM:
                return i
            c = q.confirms
            if c is not None and c not in opened and waiting.count(c) >= runs and self._lower_bound(c) < mine:
                return i
        return len(self.pending)

    def fitting_confirmation(self, held: Proposal, fits: Callable[[Proposal], bool]) -> Proposal | None:
        """A confirmation run ``held`` that does not fit the budget left (``fits``) gives way to the first waiting
        run of another candidate that does (a cheaper trial: fewer samples per prompt), taken off the queue; ``held``
        keeps its place. Only confirmation runs swap: the proposer's own order (the baseline first, a crash's retry)
        is kept. Seen on a real study: the strongest candidate's gens-32 runs, first in line, need 11 minutes cold."""
        if held.proposer != Proposer.CONFIRM:
            return None
        for i, q in enumerate(self.pending):
            if q is not held and q.proposer == Proposer.CONFIRM and q.confirms != held.confirms and fits(q):
                return self.pending.pop(i)
        return None

    def _lower_bound(self, number: int) -> float:
        """The lower end of a candidate's gain interval (-inf when it has none)."""
        low = self.records.trial(number).ci_low
        return low if low is not None else float("-inf")

    def _confirmation(self, p: Proposal, number: int, k: int, runs: int) -> Proposal:
        """Confirmation run ``k`` of candidate ``number``: its values with fresh seed ``confirm_seed``."""
        seed = self._confirm_seed(p, number, k)
        why = f"confirmation {k + 1}/{runs} of candidate {number:02d}: the same recipe with fresh seed {seed}"
        return Proposal(
            Proposer.CONFIRM,
            {**p.values, "seed": seed},
            why,
            f"confirm-{number:02d}-s{seed}",
            hypothesis=p.hypothesis,
            patch=p.patch,
            parent=p.parent,
            confirms=number,
        )

    def _confirm_seed(self, p: Proposal, number: int, k: int) -> int:
        return int({**self.view.base.train, **p.values}.get("seed", 0) or 0) + 1000 + 10 * number + k

    # ---- resume: the queue a stopped controller left -----------------------------------------
    def requeue(self) -> list[Proposal]:
        """Rebuild, from the ledger, the work a stopped controller had queued but not run: the confirmation runs
        each open candidate still lacks, all of one candidate's together, the candidate nearest a decision first
        (fewest runs missing) and among equals the strongest (highest lower bound of its gain), so a short resume
        decides what the user would promote rather than whichever candidate came first; then the retries triage
        asked for crashes that have none, oldest first (a confirmation or retry the controller stopped early counts
        as not run). Seen on a real study: four candidates waiting, 12 runs, and the first in line the weakest."""
        candidates = sorted(self.records.open_candidates(), key=self._decision_order)
        crashes = sorted(self.records.unretried_crashes(), key=lambda r: r.number or 0)
        for row in [*candidates, *crashes]:
            assert row.number is not None  # a trial read from the ledger
            p = self._proposal_of(row)
            if row.status == TrialStatus.CRASH:
                action = row.crash_action or triage.crash_action(row.crash_category or CrashCategory.UNKNOWN)
                self.crash_retry(p, row.number, row.crash_category, action)
            else:
                self.pending += self._missing_confirmations(p, row.number)
        return list(self.pending)

    def _decision_order(self, row: Trial) -> tuple[int, float, int]:
        """A candidate's place on resume: runs missing, then its gain's lower bound (higher first), then age."""
        runs = self.view.base.verdict.confirm_runs
        ran = len({r.seed for r in self.records.confirm_runs(row.number or 0, ran=True)})
        return max(runs - ran, 0), -self._lower_bound(row.number or 0), row.number or 0

    def _missing_confirmations(self, p: Proposal, number: int) -> list[Proposal]:
        runs = self.view.base.verdict.confirm_runs
        ran = {r.seed for r in self.records.confirm_runs(number, ran=True)}
        return [
            self._confirmation(p, number, k, runs) for k in range(runs) if self._confirm_seed(p, number, k) not in ran
        ]

    def _proposal_of(self, row: Trial) -> Proposal:
        """The proposal a ledger row ran (its changed values, hypothesis, patch and links)."""
        assert row.proposer is not None and row.attempt is not None  # set when the attempt opens
        return Proposal(
            row.proposer,
            dict(row.changed or {}),
            row.why or "",
            row.attempt,
            hypothesis=row.hypothesis,
            retry_of=row.retry_of,
            patch=self._patch_of(row),
            parent=row.parent,
            confirms=row.confirms,
        )

    def _patch_of(self, row: Trial) -> str | None:
        """The patch the row's trial applied: its hypothesis' patch when a ranked hypothesis proposed it (or the
        trial a retry repeats)."""
        while row.retry_of is not None:
            row = self.records.trial(row.retry_of)
        return self.strategy.patch(row.hypothesis) if row.proposer == Proposer.HYPOTHESIS else None
