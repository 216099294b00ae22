"""Search strategies: each turns the study's history into the next proposal.

A strategy has two methods, ``propose() -> Proposal | None`` and ``patch(hypothesis) -> path | None``, and sees
its study only through the ``StudyView`` it is given (``autorl.search.view``: the base recipe, the study's
trials and metrics, ``search(name)`` to open an Optuna study, ``ask(search, space, fixed, at)`` to ask it away
from repeated crashes and closed regions, ``closures()``, ``tried(values)``, ``note(...)``). ``optuna`` (TPE) and
``random`` are ``OptunaStrategy``; ``hypotheses`` is ``autorl.search.hypotheses_strategy.HypothesisStrategy``.
"""

from __future__ import annotations

from typing import Protocol

from autorl.recipe import dump_values
from autorl.search.proposal import Proposal, changed
from autorl.search.view import StudyView
from autorl.states import Proposer


class Strategy(Protocol):
    def propose(self) -> Proposal | None:
        """The next proposal, or None when there is nothing to propose now."""

    def patch(self, hypothesis: str | None) -> str | None:
        """The patch a trial this strategy proposed for ``hypothesis`` applied (None: no patch)."""


class OptunaStrategy:
    """Plain Optuna over the recipe's search space: TPE for ``optuna``, the RandomSampler for ``random``."""

    def __init__(self, view: StudyView, label: Proposer = Proposer.OPTUNA):
        self.s, self.label = view, label

    def propose(self) -> Proposal:
        search = self.s.search()
        asked = self.s.ask(search, self.s.base.search)
        values = changed(self.s.base.train, asked.params)
        why = f"{self.label} proposal: {dump_values(values) or 'baseline values'}" + (
            f"; {asked.why}" if asked.why else ""
        )
        return Proposal(
            self.label,
            values,
            why,
            dump_values(values) or str(self.label),
            optuna_study=search.name,
            optuna_number=asked.number,
        )

    def patch(self, hypothesis: str | None) -> str | None:
        return None
