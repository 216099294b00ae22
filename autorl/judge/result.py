"""How one trial ended, as judged: the one value that goes to Optuna, the ledger, the results file and the views."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autorl.states import Confirmation, CrashAction, CrashCategory, TrialStatus, Verdict

# How a judged trial can end (never running; a timeout or a hang ends as a crash).
Status = Literal[
    TrialStatus.COMPLETE,
    TrialStatus.CRASH,
    TrialStatus.PRUNED,
    TrialStatus.BUDGET_CUT,
    TrialStatus.INTERRUPTED,
    TrialStatus.CONFIG_ERROR,
    TrialStatus.EARLY_STOPPED,
]


OPENED_COLUMNS = ("parent", "confirms")  # set on the row when the attempt opens


class TrialResult(BaseModel):
    """A finished trial. Field meanings are the ledger's columns of the same names (docs/ledger.md)."""

    model_config = ConfigDict(extra="forbid")

    number: int = Field(description="Attempt number NN.")
    status: Status
    reason: str = ""
    finished: float
    duration_s: float
    exit_code: int | None = None
    objective: float | None = None
    verdict: Verdict | None = None
    delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    method: str | None = None
    n_items: int | None = None
    gap_to_best: float | None = None
    flags: list[dict[str, Any]] = Field(default_factory=list)
    crash_category: CrashCategory | None = None
    crash_signature: str | None = None
    root_cause: str | None = None
    remedy: str | None = None
    crash_action: CrashAction | None = None
    parent: int | None = None
    gain_vs_baseline: float | None = None
    confirmation: Confirmation | None = None
    confirms: int | None = None
    test: str | None = None
    trial_sd: float | None = None
    parent_sd: float | None = None
    fp_rate: float | None = None

    def ledger_values(self) -> dict[str, Any]:
        """The columns this result sets on its ledger row.

        ``parent`` and ``confirms`` are written when the attempt opens; a result that leaves them unset must not
        blank them (that lost every confirmation run's link to its candidate, so nothing was ever confirmed).
        """
        keep = {k for k in OPENED_COLUMNS if getattr(self, k) is None}
        return self.model_dump(exclude={"number"} | keep)

    def headline(self) -> str:
        """'improved (objective 0.6100, delta +0.0400)': the verdict (or status) and the numbers."""
        text = str(self.verdict or self.status)
        if self.objective is None:
            return text
        delta = f", delta {self.delta:+.4f}" if self.delta is not None else ""
        return f"{text} (objective {self.objective:.4f}{delta})"
