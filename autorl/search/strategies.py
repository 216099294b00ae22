"""Search strategies: each turns the study's history into the next proposal.

A strategy has one method, ``propose() -> Proposal | None``, and talks to the study through the proposer it is
given (``search(name)`` opens an Optuna study, ``ask(search, space, fixed)`` asks it while avoiding repeated
crashes). ``optuna`` (TPE) and ``random`` are ``OptunaStrategy``; ``hypotheses`` is
``autorl.search.hypotheses_strategy.HypothesisStrategy``.
"""

from __future__ import annotations

from typing import Protocol

from autorl.recipe import dump_values
from autorl.search.proposal import Proposal, changed


class Strategy(Protocol):
    def propose(self) -> Proposal | None:
        """The next proposal, or None when there is nothing to propose now."""


class OptunaStrategy:
    """Plain Optuna over the recipe's search space: TPE for ``optuna``, the RandomSampler for ``random``."""

    def __init__(self, proposer, label: str = "optuna"):
        self.p, self.label = proposer, label

    def propose(self) -> Proposal:
        search = self.p.search()
        number, params = self.p.ask(search, self.p.base.search)
        values = changed(self.p.base.train, params)
        why = f"{self.label} proposal: {dump_values(values) or 'baseline values'}"
        return Proposal(self.label, values, why, dump_values(values) or self.label,
                        optuna_study=search.name, optuna_number=number)
