"""How long a promote will run, planned from the study's own trials before any GPU time is spent on it.

A promote runs fresh processes: its re-validation runs (the trial and the baseline, ``repeats`` seeds each,
``parallel`` at once) and then the full run. Each is planned as the study plans a cold trial (``autorl.runs.plan``:
the finished trials' durations against their work, plus the cold trials' extra start-up), the full run by its work
against theirs. A full run no longer than a trial is said: a promote of a recipe without a ``full`` block and with
no ``--steps`` / ``--episodes`` trains exactly as long as the trial it promotes.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict

from autorl.backends.base import get_backend, work
from autorl.budget import format_duration
from autorl.ledger import Ledger, Trial
from autorl.runs import plan


class PromotePlan(BaseModel):
    """The planned seconds of a promote's parts, from ``runs`` finished trials of its study."""

    model_config = ConfigDict(extra="forbid")
    trial_s: float
    baseline_s: float
    revalidation_s: float
    full_s: float
    full_work: float  # the full run's work over the trial's: 1.0 is a trial's length
    from_trials: int
    length_flags: str  # what sets a full run's length on this backend: "--steps", "--episodes" or both

    def lines(self, repeats: int, parallel: int) -> list[str]:
        runs = 2 * repeats
        out = [
            f"plan, from the study's last {self.from_trials} finished trials (cold starts, as a promote's runs start): "
            f"re-validation {runs} runs, {min(parallel, runs)} at once, about {format_duration(self.revalidation_s)} "
            f"(a run of the trial about {format_duration(self.trial_s)}, of the baseline about "
            f"{format_duration(self.baseline_s)}); then the full run, {self.full_work:.3g}x a trial's work, about "
            f"{format_duration(self.full_s)} before any checkpoint evals"
        ]
        if self.full_work <= 1.0:
            out.append(
                f"note: this full run is no longer than the trial it promotes: lengthen it with {self.length_flags} "
                "(or the recipe's full block)"
            )
        return out


def promote_plan(
    ledger: Ledger,
    row: Trial,
    trial_train: dict[str, Any],
    full_train: dict[str, Any],
    backend: str,
    repeats: int,
    parallel: int,
) -> PromotePlan | None:
    """The plan of a promote of trial ``row`` (None when its study has no finished trial to plan from)."""
    b = get_backend(backend)
    keys = b.work_keys
    took = plan.recent(ledger.records(row.study_id), keys)
    if not took:
        return None
    baselines = ledger.baselines(row.study_id)
    base_train = (baselines[0].params or {}) if baselines else trial_train

    def planned(values: dict[str, Any]) -> float:
        return plan.expected(took, work(values, keys), math.inf, math.inf, cold=True).seconds

    trial_s, baseline_s = planned(trial_train), planned(base_train)
    waves = math.ceil(2 * repeats / max(1, parallel))
    return PromotePlan(
        trial_s=round(trial_s, 1),
        baseline_s=round(baseline_s, 1),
        revalidation_s=round(waves * max(trial_s, baseline_s), 1),
        full_s=round(planned(full_train), 1),
        full_work=round(work(full_train, keys) / work(trial_train, keys), 4),
        from_trials=len(took),
        length_flags=" or ".join(f for f, key in (("--steps", b.steps_key), ("--episodes", b.episodes_key)) if key),
    )
