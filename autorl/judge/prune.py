"""Noise-aware pruning: stop a trial only when it is clearly worse than a reference at the same step.

Optuna's median pruner compares one noisy number with the median of other trials' numbers and
so stops about half of all trials whatever their quality. Here an intermediate eval is compared
item by item with a reference's evals at the same step on the same items (the controller asks for
the trial's parent, then the study's confirmed incumbent: ``autorl.judge.evidence``), with the verdict's
noise model (per-item flips plus each arm's run-level shift: the trial's never assumed quieter than the
reference's, and as loud as the study's other changed recipes where they are louder), at the recipe's ``prune_level``
(99%
two-sided by default: with one baseline run the prior's single df makes t heavy-tailed, and at
99.9% even a 43-point drop on 500 items was not 'clearly worse'). The trial is stopped only when
even the upper end of the interval for its gain is below 0. The hard rules (collapse, NaN, stuck reward) are
``autorl.judge.abort``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from autorl.judge.verdict import Noise, Runs, judge, pct
from autorl.recipe import VerdictSettings


class PruneDecision(BaseModel):
    """Why a trial is stopped at an intermediate eval."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(description="The eval step.")
    delta: float = Field(description="Gain over the incumbent at that step (negative).")
    ci_high: float = Field(description="Upper end of the interval for the gain (below 0).")
    reason: str = Field(description="One line a person can read.")


def should_prune(
    step: int,
    trial_items: list[float] | None,
    reference_items: list[list[float]] | None,
    settings: VerdictSettings,
    direction: str,
    noise: Noise | None = None,
    than: str = "the incumbent",
) -> PruneDecision | None:
    """A decision to stop, or None (also when either side lacks per-item results at this step).

    ``reference_items`` are the reference's runs' items at the same ``step``; ``noise`` the replicate groups at
    that step behind each arm (``verdict.Noise``: the reference recipe's group, the study's changed recipes);
    ``than`` names the reference in the reason.
    """
    if not trial_items or not reference_items or any(len(r) != len(trial_items) for r in reference_items):
        return None
    v = judge(
        Runs(values=[0.0], items=[trial_items]),
        Runs(values=[0.0] * len(reference_items), items=reference_items),
        settings,
        direction,
        noise,
        level=settings.prune_level,
    )
    if v.ci_high >= 0:
        return None
    reason = (
        f"clearly worse than {than} at step {step}: gain {v.delta:+.3f}, "
        f"{pct(v.level)} CI [{v.ci_low:+.3f}, {v.ci_high:+.3f}] on {v.n} paired items"
    )
    return PruneDecision(step=step, delta=v.delta, ci_high=v.ci_high, reason=reason)
