"""A proposal: the next trial as a plain value (what to change, why, and which Optuna trial it answers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autorl.states import Proposer


@dataclass(frozen=True)
class Proposal:
    """The next trial: values to change in the base recipe, and why.

    ``optuna_study``/``optuna_number`` name the Optuna trial it answers (told by the proposer when the trial ends);
    the values are exactly the numbers Optuna sampled, so the commit, the ledger and Optuna hold the same value.
    """

    proposer: Proposer
    values: dict[str, Any]
    why: str
    slug: str
    hypothesis: str | None = None
    optuna_study: str | None = None
    optuna_number: int | None = None
    retry_of: int | None = None
    patch: str | None = None
    parent: int | None = None  # attempt number of the recipe it modifies (None = the baseline)
    confirms: int | None = None  # attempt number of the candidate this run re-runs with a fresh seed


def changed(base: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``params`` whose value differs from ``base`` (exact values: nothing is rounded)."""
    return {k: v for k, v in params.items() if base.get(k) != v}
