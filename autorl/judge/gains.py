"""The gain of each confirmed recipe over the study's baseline, and the smallest gain a test could have seen.

A verdict is against the trial's parent, so a confirmed improvement built on another one (lr 5e-6 -> 5e-5 on top of
5e-7 -> 5e-6) carries only its own step. What a person adopts is a recipe, so confirmed recipes are ranked by their
gain over the baseline, measured: the recipe's fresh-seed confirmation runs against the baseline's runs, by the
same test a verdict uses (``verdict.judge`` at the study's level, the study's replicate groups for the run noise).
The run that made the trial a candidate is left out, as in its confirmation: it was picked for looking good. Every
confirmed trial has such runs (that is what confirmed it), so the gain is measured directly rather than summed
along the chain of confirmed steps, whose links share runs; the chain is kept to say how the recipe was reached.

``detectable`` turns an interval into the smallest true gain its test would have called improved 4 times in 5.
That can be more than the objective allows: a pass@1 lies in [0, 1], so over a parent at 0.625 no recipe can
gain more than +0.375, yet a flat test on two baseline runs (one replicate df, Student's t at 12.7) had an
interval 3.6 wide and "could detect +2.550". ``sensitivity`` says both, the smallest detectable gain and the
largest possible one (``possible_gain``, from the metric's range in ``autorl.metrics``), and a test whose
detectable gain is beyond the possible one is ``blind``: it could detect no gain at all.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from autorl.errors import RecipeError
from autorl.judge import verdict
from autorl.judge.evidence import Evidence, runs_of
from autorl.ledger import Ledger, Study, StudyRecords, Trial
from autorl.metrics import value_range
from autorl.recipe import Recipe, recipe_from_text
from autorl.states import Kind, TrialStatus

POWER = 0.8
"""The chance at which a gain counts as detectable (the usual 80 % power)."""


class Gain(BaseModel):
    """A confirmed recipe's gain over the study's baseline, better-is-positive."""

    model_config = ConfigDict(extra="forbid")

    number: int = Field(description="Attempt number of the confirmed trial.")
    attempt: str = Field(description="Its attempt name (its branch).")
    chain: list[int] = Field(description="The confirmed improvements from the baseline to it, oldest first.")
    delta: float = Field(description="Gain over the baseline on the objective.")
    ci_low: float = Field(description="Lower end of its interval.")
    ci_high: float = Field(description="Upper end of its interval.")
    level: float = Field(description="Two-sided level of the interval.")
    runs: int = Field(description="Its fresh-seed runs the gain was measured on.")
    baseline_runs: int = Field(description="Baseline runs it was measured against.")
    method: str = Field(description="How the interval was computed (the verdict's method).")
    n: int = Field(description="Paired items (or runs) behind the interval.")
    trial_sd: float | None = Field(
        None, description="Run-to-run sd assumed for the recipe's runs (None: the interval modelled no run noise)."
    )
    noise_df: int = Field(
        0,
        description="Replicate df behind trial_sd: the run noise the study had measured when the gain was "
        "computed. It grows as more recipes are re-run, so the interval of the same gain moves with it.",
    )

    def interval(self) -> str:
        """'+0.147 (95% interval [+0.090, +0.204])'."""
        return f"{self.delta:+.3f} ({verdict.pct(self.level)} interval [{self.ci_low:+.3f}, {self.ci_high:+.3f}])"

    def describe(self) -> str:
        """How the gain was measured, in words."""
        steps = " → ".join(f"{n:02d}" for n in self.chain)
        chain = f"; reached in confirmed steps {steps}" if len(self.chain) > 1 else ""
        items = f", paired over {self.n} eval items" if self.method == "paired_items" else ""
        return (
            f"measured on its {self.runs} fresh-seed runs against the {self.baseline_runs} baseline "
            f"runs{items}{self.noise()}{chain}"
        )

    def noise(self) -> str:
        """', at the run noise measured so far (sd 0.011 over 8 df)': what widens or narrows the interval as the
        study re-runs more recipes ('' when the interval modelled no run noise)."""
        if self.trial_sd is None:
            return ""
        return f", at the run noise measured so far (sd {self.trial_sd:.2g} over {self.noise_df} df)"


def chain_of(trials: dict[int, Trial], number: int) -> list[int]:
    """Attempt numbers from the first confirmed improvement on the baseline to ``number``, following parents."""
    out, seen = [], set()
    at: int | None = number
    while at is not None and at in trials and at not in seen:
        seen.add(at)
        out.append(at)
        at = trials[at].parent
    return out[::-1]


def study_recipe(study: Study) -> Recipe | None:
    """The base recipe a study recorded, validated (None when it no longer validates: an older ledger)."""
    try:
        return recipe_from_text(study.recipe or "", study.recipe_path or "the study's recipe")
    except RecipeError:
        return None


def study_gains(ledger: Ledger, study: Study) -> dict[int, Gain]:
    """``baseline_gains`` of one study of a ledger; empty without its recipe."""
    recipe = study_recipe(study)
    return baseline_gains(ledger.records(study.id), recipe) if recipe is not None else {}


def baseline_gains(records: StudyRecords, recipe: Any, evidence: Evidence | None = None) -> dict[int, Gain]:
    """Every confirmed trial of the study with its gain over the baseline."""
    ev = evidence or Evidence(records)
    by_number = {t.number: t for t in records.trials(kind=Kind.TRIAL)}
    out = {}
    for row in records.confirmed():
        links = chain_of(by_number, row.number)
        gain = measure(ev, row, recipe, links)
        if gain is not None:
            out[row.number] = gain
    return out


def ranked(gains: dict[int, Gain]) -> list[Gain]:
    """Confirmed recipes, best first: by gain over the baseline, then by its lower end, then the later attempt
    (which was built on, and confirmed against, what came before it)."""
    return sorted(gains.values(), key=lambda g: (-g.delta, -g.ci_low, -g.number))


def measure(ev: Evidence, row: Trial, recipe: Any, links: list[int]) -> Gain | None:
    """The trial's completed fresh-seed runs against the baseline's runs (None when either side has none)."""
    fresh_rows = [r for r in ev.records.confirm_runs(row.number, ran=True) if r.status == TrialStatus.COMPLETE]
    baseline = ev.baseline_runs()
    fresh, base = runs_of([ev.metrics(r) for r in fresh_rows], recipe), runs_of(baseline, recipe)
    if fresh is None or base is None:
        return None
    v = verdict.judge(fresh, base, recipe.verdict, recipe.objective.direction, ev.noise(recipe, None))
    return Gain(
        number=row.number,
        attempt=row.attempt,
        chain=links,
        delta=v.delta,
        ci_low=v.ci_low,
        ci_high=v.ci_high,
        level=v.level,
        runs=len(fresh.values),
        baseline_runs=len(base.values),
        method=v.method,
        n=v.n,
        trial_sd=v.trial_sd,
        noise_df=v.trial_df,
    )


def detectable(
    ci_low: float, ci_high: float, level: float, min_effect: float = 0.0, power: float = POWER
) -> float | None:
    """The smallest true gain that a test with this interval would call improved (lower end above ``min_effect``)
    with probability ``power``: ``min_effect`` plus the half-width, plus the power's share of the standard error
    (normal approximation). None for an interval that is not finite."""
    if not all(math.isfinite(x) for x in (ci_low, ci_high)) or ci_high < ci_low:
        return None
    half = (ci_high - ci_low) / 2
    return min_effect + half * (1 + NormalDist().inv_cdf(power) / _z(level))


class Sensitivity(NamedTuple):
    """What a judged trial's test could see: the smallest gain it would call improved 4 times in 5 (None: its
    interval is not finite) and the largest gain the objective's range leaves over the parent (None: a metric
    without a known range)."""

    detectable: float | None
    possible: float | None

    @property
    def blind(self) -> bool:
        """It would take more than any possible gain: the test could detect none."""
        return self.detectable is not None and self.possible is not None and self.detectable > self.possible

    @property
    def seen(self) -> float | None:
        """The detectable gain when some possible gain reaches it, else None."""
        return None if self.blind else self.detectable


def sensitivity(row: Trial, objective: Any | None, level: float, min_effect: float = 0.0) -> Sensitivity:
    """A judged trial's ``Sensitivity`` from its ledger row (its interval, objective and gain over its parent) and
    the study's ``objective`` (None: unknown, no range)."""
    low, high = row.ci_low, row.ci_high
    found = detectable(low, high, level, min_effect) if low is not None and high is not None else None
    if objective is None:
        return Sensitivity(found, None)
    value, delta = row.objective, row.delta
    sign = 1.0 if objective.direction == "maximize" else -1.0
    parent = value - sign * delta if value is not None and delta is not None else None
    return Sensitivity(found, possible_gain(objective.metric, objective.direction, parent))


def possible_gain(metric: str, direction: str, parent: float | None) -> float | None:
    """The largest true gain (better-is-positive) the metric's range leaves over a parent at ``parent``; the whole
    range when the parent's value is unknown; None for a metric without a known range."""
    bounds = value_range(metric)
    if bounds is None:
        return None
    lo, hi = bounds
    if parent is None or not math.isfinite(parent):
        return hi - lo
    parent = min(max(parent, lo), hi)
    return hi - parent if direction == "maximize" else parent - lo


def _half(v: verdict.Judgement) -> float:
    return (v.ci_high - v.ci_low) / 2


def _z(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2)
